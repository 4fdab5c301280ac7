//! A local S3 protocol server for tests: `moto`'s server (PyPI `moto[server]`), started on a
//! free port of 127.0.0.1 and killed when dropped, and uploads to it.
//!
//! Without `moto` the tests that need it are skipped with a note on stderr, so that
//! `cargo test` passes on a machine without Python packages; `.ci/run` installs it and sets
//! `BACKFILL_REQUIRE_S3=1`, under which a missing server is a failure.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server and the environment that points the tool at it.
pub struct S3Server {
    child: Child,
    pub endpoint: String,
}

impl S3Server {
    /// Starts a server, or `None` (with a note) when moto is not installed and not required.
    pub fn start() -> Option<S3Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let spawned = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let required = std::env::var_os("BACKFILL_REQUIRE_S3").is_some_and(|v| v == "1");
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) if !required => {
                eprintln!("skipped: no python3 for the S3 test server ({e})");
                return None;
            }
            Err(e) => panic!("cannot start the S3 test server: {e}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                assert!(
                    !required,
                    "the S3 test server exited ({status}): pip install 'moto[server]'"
                );
                eprintln!("skipped: no S3 test server (pip install 'moto[server]')");
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "the S3 test server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(S3Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        })
    }

    /// The environment variables that point an object store client at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }

    /// A client of `bucket` on this server (the bucket is made if it is new).
    pub fn bucket(&self, bucket: &str) -> object_store::aws::AmazonS3 {
        let url = format!("{}/{bucket}", self.endpoint);
        // moto makes a bucket on a PUT of its URL.
        let status = Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-X",
                "PUT",
                &url,
            ])
            .output()
            .expect("curl runs");
        assert_eq!(
            String::from_utf8_lossy(&status.stdout),
            "200",
            "create bucket {bucket}"
        );
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_bucket_name(bucket)
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .with_region("us-east-1")
            .with_allow_http(true)
            .build()
            .expect("an S3 client")
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Uploads every file under `dir` to `store` under `prefix`, keeping relative paths.
pub fn upload_dir(store: &object_store::aws::AmazonS3, dir: &Path, prefix: &str) {
    use object_store::ObjectStoreExt;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (path, bytes) in super::files::files_under(dir) {
        let relative = path
            .strip_prefix(dir)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let key = object_store::path::Path::from(format!("{prefix}/{relative}"));
        runtime
            .block_on(store.put(&key, bytes.into()))
            .unwrap_or_else(|e| panic!("upload {key}: {e}"));
    }
}

/// The object names under `prefix`, sorted.
pub fn list(store: &object_store::aws::AmazonS3, prefix: &str) -> Vec<String> {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let prefix = object_store::path::Path::from(prefix);
    let mut names: Vec<String> = runtime
        .block_on(store.list(Some(&prefix)).try_collect::<Vec<_>>())
        .unwrap()
        .into_iter()
        .map(|m| m.location.to_string())
        .collect();
    names.sort();
    names
}
