//! Where a dataset's files live: a local directory, or object storage named by a URL
//! (`s3://bucket/prefix`, `gs://`, `az://`; `file:///abs/path` is a local path), read
//! through the `object_store` crate.
//!
//! ```text
//!   "s3://b/ds/snapshot/p.parquet" (a Path holding the URL)
//!        │ open()                                   │ list()          │ read()
//!        ▼                                          ▼                 ▼
//!   DataFile::Remote ── ChunkReader: ranged GETs    LIST (delimiter)  GET
//!        (the Parquet footer, then the row groups' column chunks; never the whole file first)
//! ```
//!
//! The rest of the tool keeps its `Path`s: a remote file's path is its URL as text, which
//! names it in every error message. Object stores are configured by the standard environment
//! variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ALLOW_HTTP`; `GOOGLE_SERVICE_ACCOUNT`...; `AZURE_STORAGE_ACCOUNT_NAME`...), one store
//! per bucket, opened once per process. Their async calls run on a small runtime of their own,
//! so that any thread, inside the replay's runtime or not, can wait for them.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::file::reader::{ChunkReader, Length};

use crate::error::{Error, Result};

/// The URL schemes read through object storage.
const SCHEMES: [&str; 6] = ["s3://", "s3a://", "gs://", "az://", "abfs://", "memory://"];

/// Whether `path` is an object-storage URL.
pub fn is_url(path: &Path) -> bool {
    let text = path.to_string_lossy();
    SCHEMES.iter().any(|scheme| text.starts_with(scheme))
}

/// A path or URL as the user gave it: `file:///x` becomes the local path `/x`.
pub fn local_or_url(text: &str) -> PathBuf {
    match text.strip_prefix("file://") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(text),
    }
}

/// The runtime the object stores' calls run on.
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<std::io::Result<tokio::runtime::Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("backfill-object-io")
                .enable_all()
                .build()
        })
        .as_ref()
        .map_err(|e| Error::config(format!("cannot start the object storage runtime: {e}")))
}

/// Runs `future` on the object storage runtime and waits for it, from any thread.
fn block<T: Send + 'static>(
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T> {
    let task = runtime()?.spawn(future);
    futures::executor::block_on(task)
        .map_err(|e| Error::config(format!("an object storage call failed: {e}")))
}

/// The store behind a URL, and the object path within it.
#[derive(Clone)]
struct Located {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
}

/// Stores registered by tests for `memory://NAME` URLs.
fn memory_stores() -> &'static Mutex<HashMap<String, Arc<dyn ObjectStore>>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// Makes `memory://name/...` URLs read `store` (for tests: object_store's `InMemory`).
#[cfg(test)]
pub fn register_memory_store(name: &str, store: Arc<dyn ObjectStore>) {
    if let Ok(mut stores) = memory_stores().lock() {
        stores.insert(name.to_string(), store);
    }
}

fn locate(path: &Path) -> Result<Located> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> = OnceLock::new();
    let text = path.to_string_lossy();
    let bad = |message: String| Error::dataset(path, "", message);
    let (scheme, rest) = text
        .split_once("://")
        .ok_or_else(|| bad("not a URL".into()))?;
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(bad(format!(
            "a {scheme}:// URL names a bucket: {scheme}://BUCKET/PATH"
        )));
    }
    let object = ObjectPath::parse(key.trim_end_matches('/'))
        .map_err(|e| bad(format!("not an object path: {e}")))?;
    if scheme == "memory" {
        let stores = memory_stores()
            .lock()
            .map_err(|_| bad("store registry poisoned".into()))?;
        let store = stores
            .get(bucket)
            .cloned()
            .ok_or_else(|| bad(format!("no in-memory store `{bucket}`")))?;
        return Ok(Located {
            store,
            path: object,
        });
    }
    let base = format!("{scheme}://{bucket}");
    let mut stores = (STORES.get_or_init(Default::default).lock())
        .map_err(|_| bad("store registry poisoned".into()))?;
    let store = match stores.get(&base) {
        Some(store) => store.clone(),
        None => {
            let store = open_store(scheme, &base).map_err(|e| {
                bad(format!(
                    "cannot open the object store {base}: {e} (configured by the environment: \
                     AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, \
                     AWS_ALLOW_HTTP for s3://, and the GCS and Azure equivalents)"
                ))
            })?;
            stores.insert(base, store.clone());
            store
        }
    };
    Ok(Located {
        store,
        path: object,
    })
}

fn open_store(
    scheme: &str,
    base: &str,
) -> std::result::Result<Arc<dyn ObjectStore>, object_store::Error> {
    Ok(match scheme {
        "s3" | "s3a" => Arc::new(
            object_store::aws::AmazonS3Builder::from_env()
                .with_url(base)
                .build()?,
        ),
        "gs" => Arc::new(
            object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(base)
                .build()?,
        ),
        _ => Arc::new(
            object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(base)
                .build()?,
        ),
    })
}

/// An entry of a listing: a file (with its size) or a directory (a common prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: PathBuf,
    pub name: String,
    pub is_file: bool,
    /// A file's size.
    pub size: u64,
    /// A file's entity tag, when the store gives one: it changes whenever the object is
    /// written with other bytes.
    pub e_tag: Option<String>,
}

/// The entries directly under the URL `dir`; `None` when there are none (object storage has
/// no empty directories: an absent prefix and an empty one are the same).
pub fn list(dir: &Path) -> Result<Option<Vec<Entry>>> {
    let located = locate(dir)?;
    let prefix = located.path.clone();
    let store = located.store.clone();
    let listing = block(async move { store.list_with_delimiter(Some(&prefix)).await })?
        .map_err(|e| Error::dataset(dir, "", format!("cannot list: {e}")))?;
    let base = dir.to_string_lossy().trim_end_matches('/').to_string();
    let mut entries = Vec::new();
    for object in &listing.objects {
        if let Some(name) = object.location.filename() {
            entries.push(Entry {
                path: PathBuf::from(format!("{base}/{name}")),
                name: name.to_string(),
                is_file: true,
                size: object.size,
                e_tag: object.e_tag.clone(),
            });
        }
    }
    for prefix in &listing.common_prefixes {
        if let Some(name) = prefix.filename() {
            entries.push(Entry {
                path: PathBuf::from(format!("{base}/{name}")),
                name: name.to_string(),
                is_file: false,
                size: 0,
                e_tag: None,
            });
        }
    }
    Ok((!entries.is_empty()).then_some(entries))
}

/// The whole object at the URL `path` (a small one: a manifest); `None` if there is none.
pub fn read(path: &Path) -> Result<Option<Bytes>> {
    let located = locate(path)?;
    let got = block(async move {
        match located.store.get(&located.path).await {
            Ok(result) => result.bytes().await.map(Some),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    })?;
    got.map_err(|e| Error::dataset(path, "", format!("cannot read: {e}")))
}

/// A failed call on the object at `path`: an I/O error (exit status 1), not bad input.
fn io_error(path: &Path, message: String) -> Error {
    Error::from(crate::store::io::named(
        path,
        std::io::Error::other(message),
    ))
}

/// What a create-if-absent put found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// The object is new: this put made it.
    Created,
    /// An object was there already (it is left as it was).
    Exists,
}

/// Puts `bytes` at the URL `path` only if no object is there (a conditional write: of two
/// writers, exactly one creates it).
pub fn put_if_absent(path: &Path, bytes: Bytes) -> Result<Put> {
    let located = locate(path)?;
    let put = block(async move {
        let options = object_store::PutOptions::from(object_store::PutMode::Create);
        located
            .store
            .put_opts(&located.path, bytes.into(), options)
            .await
    })?;
    match put {
        Ok(_) => Ok(Put::Created),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(Put::Exists),
        Err(e) => Err(io_error(path, format!("cannot write: {e}"))),
    }
}

/// Puts `bytes` at the URL `path`, replacing any object there.
pub fn put(path: &Path, bytes: Bytes) -> Result<()> {
    let located = locate(path)?;
    let put = block(async move { located.store.put(&located.path, bytes.into()).await })?;
    put.map(|_| ())
        .map_err(|e| io_error(path, format!("cannot write: {e}")))
}

/// Bytes an upload sends per part, and the largest object sent in one PUT.
const PART_SIZE: usize = 8 << 20;
/// Parts of one upload in flight at once: an upload holds at most this many parts' bytes.
const PARTS_IN_FLIGHT: usize = 4;

/// Uploads the local file `from` to the URL `to` (replacing any object there), in parts:
/// memory holds at most [`PARTS_IN_FLIGHT`] parts, whatever the file's size. Returns the
/// bytes sent.
pub fn put_file(from: &Path, to: &Path) -> Result<u64> {
    let mut file = File::open(from).map_err(|e| crate::store::io::named(from, e))?;
    let size = file
        .metadata()
        .map_err(|e| crate::store::io::named(from, e))?
        .len();
    if size <= PART_SIZE as u64 {
        let mut bytes = Vec::with_capacity(size as usize);
        file.read_to_end(&mut bytes)
            .map_err(|e| crate::store::io::named(from, e))?;
        let sent = bytes.len() as u64;
        put(to, bytes.into())?;
        return Ok(sent);
    }
    let located = locate(to)?;
    let from = from.to_path_buf();
    let target = to.to_path_buf();
    let sent = block(async move {
        let upload = (located.store.put_multipart(&located.path).await)
            .map_err(|e| io_error(&target, format!("cannot start an upload: {e}")))?;
        let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        let mut buf = vec![0u8; PART_SIZE];
        let mut sent = 0u64;
        loop {
            // A blocking read on the object runtime's thread: one part at a time, between
            // the parts' sends.
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    writer.abort().await.ok();
                    return Err(Error::from(crate::store::io::named(&from, e)));
                }
            };
            if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
                return Err(io_error(&target, format!("cannot write: {e}")));
            }
            writer.write(&buf[..n]);
            sent += n as u64;
        }
        (writer.finish().await).map_err(|e| io_error(&target, format!("cannot write: {e}")))?;
        Ok(sent)
    })??;
    Ok(sent)
}

/// Downloads the object at the URL `from` into the new local file `to`, streamed (memory
/// holds one chunk of the response at a time). Returns its size; `None` if there is no
/// object.
pub fn get_file(from: &Path, to: &Path) -> Result<Option<u64>> {
    use std::io::Write;
    let located = locate(from)?;
    let source = from.to_path_buf();
    let target = to.to_path_buf();
    block(async move {
        use futures::StreamExt;
        let got = match located.store.get(&located.path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(io_error(&source, format!("cannot read: {e}"))),
        };
        let mut file = File::create(&target).map_err(|e| crate::store::io::named(&target, e))?;
        let mut stream = got.into_stream();
        let mut size = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| io_error(&source, format!("cannot read: {e}")))?;
            file.write_all(&chunk)
                .map_err(|e| crate::store::io::named(&target, e))?;
            size += chunk.len() as u64;
        }
        file.sync_all()
            .map_err(|e| crate::store::io::named(&target, e))?;
        Ok(Some(size))
    })?
}

/// Copies the object at the URL `from` to the URL `to` in the same store (server side),
/// replacing any object there.
pub fn copy(from: &Path, to: &Path) -> Result<()> {
    let source = locate(from)?;
    let target = locate(to)?;
    let copied = block(async move { source.store.copy(&source.path, &target.path).await })?;
    copied.map_err(|e| io_error(to, format!("cannot copy {} here: {e}", from.display())))
}

/// The entity tag of the object at the URL `path` (`None`: no object, or no tag).
pub fn e_tag(path: &Path) -> Result<Option<String>> {
    let located = locate(path)?;
    let head = block(async move { located.store.head(&located.path).await })?;
    match head {
        Ok(meta) => Ok(meta.e_tag),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(io_error(path, format!("cannot look up: {e}"))),
    }
}

/// Deletes the object at the URL `path` (no object there is no error).
pub fn delete(path: &Path) -> Result<()> {
    let located = locate(path)?;
    let deleted = block(async move { located.store.delete(&located.path).await })?;
    match deleted {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(io_error(path, format!("cannot delete: {e}"))),
    }
}

/// A dataset file to read Parquet from: local, or an object read by ranges.
pub enum DataFile {
    Local(File),
    Remote(RemoteFile),
}

/// An object of known size, read by ranged GETs.
#[derive(Clone)]
pub struct RemoteFile {
    located: Located,
    size: u64,
    /// Its last modification, in nanoseconds since the epoch.
    modified_ns: i128,
    url: PathBuf,
    /// The last window of bytes a small `get_bytes` fetched (its start, its bytes): the
    /// column chunks of small row groups (a replay's output files) lie side by side, and one
    /// GET of [`READ_AHEAD`] serves the next ones too (a file that small, all of them).
    window: Arc<Mutex<Option<(u64, Bytes)>>>,
}

/// Bytes of the window a small read fetches (Parquet's sync reader reads page headers
/// through `get_read`, column chunks through `get_bytes`, one range each).
const READ_AHEAD: u64 = 4 << 20;
/// Bytes a `get_read` takes from the window at a time.
const READ_PIECE: u64 = 64 << 10;

impl RemoteFile {
    fn range(&self, start: u64, end: u64) -> parquet::errors::Result<Bytes> {
        let located = self.located.clone();
        let fetched =
            block(async move { located.store.get_range(&located.path, start..end).await })
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?;
        fetched.map_err(|e| {
            parquet::errors::ParquetError::General(format!(
                "{}: cannot read bytes {start}..{end}: {e}",
                self.url.display()
            ))
        })
    }
}

/// Opens the file at `path`: a local file, or (for a URL) the object, whose size one HEAD
/// request gives.
pub fn open(path: &Path) -> Result<DataFile> {
    let cannot = |e: String| Error::dataset(path, "", format!("cannot open: {e}"));
    if !is_url(path) {
        return File::open(path)
            .map(DataFile::Local)
            .map_err(|e| cannot(e.to_string()));
    }
    let located = locate(path)?;
    let head = located.clone();
    let meta = block(async move { head.store.head(&head.path).await })?
        .map_err(|e| cannot(e.to_string()))?;
    Ok(DataFile::Remote(RemoteFile {
        located,
        size: meta.size,
        modified_ns: i128::from(meta.last_modified.timestamp_nanos_opt().unwrap_or(0)),
        url: path.to_path_buf(),
        window: Arc::default(),
    }))
}

impl DataFile {
    /// The file's last modification, in nanoseconds since the epoch.
    pub fn modified_ns(&self) -> std::io::Result<i128> {
        use std::os::unix::fs::MetadataExt;
        match self {
            DataFile::Local(file) => {
                let meta = file.metadata()?;
                Ok(i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()))
            }
            DataFile::Remote(remote) => Ok(remote.modified_ns),
        }
    }
}

impl Length for DataFile {
    fn len(&self) -> u64 {
        match self {
            DataFile::Local(file) => file.len(),
            DataFile::Remote(remote) => remote.size,
        }
    }
}

/// A `Read` over a remote object from an offset, [`READ_PIECE`] bytes at a time from the
/// file's window.
pub struct RemoteRead {
    file: RemoteFile,
    position: u64,
    buffer: Bytes,
}

impl Read for RemoteRead {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.buffer.is_empty() {
            if self.position >= self.file.size {
                return Ok(0);
            }
            // Through the file's window: the page headers of neighbouring column chunks
            // (each read with a `get_read` of its own) come from one GET.
            let end = (self.position + READ_PIECE).min(self.file.size);
            self.buffer = self
                .file
                .bytes(self.position, end)
                .map_err(std::io::Error::other)?;
            self.position = end;
        }
        let n = out.len().min(self.buffer.len());
        out[..n].copy_from_slice(&self.buffer[..n]);
        self.buffer = self.buffer.slice(n..);
        Ok(n)
    }
}

/// What [`DataFile::get_read`] returns.
pub enum DataRead {
    Local(<File as ChunkReader>::T),
    Remote(RemoteRead),
}

impl Read for DataRead {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        match self {
            DataRead::Local(read) => read.read(out),
            DataRead::Remote(read) => read.read(out),
        }
    }
}

impl ChunkReader for DataFile {
    type T = DataRead;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        match self {
            DataFile::Local(file) => file.get_read(start).map(DataRead::Local),
            DataFile::Remote(remote) => Ok(DataRead::Remote(RemoteRead {
                file: remote.clone(),
                position: start,
                buffer: Bytes::new(),
            })),
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        match self {
            DataFile::Local(file) => file.get_bytes(start, length),
            DataFile::Remote(remote) => {
                let end = start + length as u64;
                if end > remote.size {
                    return Err(parquet::errors::ParquetError::EOF(format!(
                        "{}: bytes {start}..{end} are past the end ({})",
                        remote.url.display(),
                        remote.size
                    )));
                }
                remote.bytes(start, end)
            }
        }
    }
}

impl RemoteFile {
    /// Bytes `start..end`: from the last window when it holds them; a small range fetches
    /// a new window of [`READ_AHEAD`] bytes from `start`; a large one is fetched as it is.
    fn bytes(&self, start: u64, end: u64) -> parquet::errors::Result<Bytes> {
        let cached = |window: &Option<(u64, Bytes)>| {
            window.as_ref().and_then(|(at, bytes)| {
                (start >= *at && end <= at + bytes.len() as u64)
                    .then(|| bytes.slice((start - at) as usize..(end - at) as usize))
            })
        };
        if let Ok(window) = self.window.lock()
            && let Some(bytes) = cached(&window)
        {
            return Ok(bytes);
        }
        if end - start >= READ_AHEAD / 4 {
            return self.range(start, end);
        }
        // The window ends at the file's end when it can (a file no larger than a window is
        // fetched whole, once).
        let window_start = start.min(self.size.saturating_sub(READ_AHEAD));
        let window_end = (window_start + READ_AHEAD).min(self.size);
        let bytes = self.range(window_start, window_end)?;
        let wanted = bytes.slice((start - window_start) as usize..(end - window_start) as usize);
        if let Ok(mut window) = self.window.lock() {
            *window = Some((window_start, bytes));
        }
        Ok(wanted)
    }
}

/// The fault seam of object storage (tests): a store that fails its N-th mutating call
/// (a put, conditional or not, a copy, a delete), or holds every put until it is let go
/// (a slow upload), around another store.
#[cfg(test)]
pub mod faulty {
    use std::fmt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::StreamExt;
    use futures::stream::BoxStream;
    use object_store::path::Path;
    use object_store::{
        CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
        PutMultipartOptions, PutOptions, PutPayload, PutResult,
    };

    /// See the module docs.
    #[derive(Debug)]
    pub struct FaultyStore {
        inner: Arc<dyn ObjectStore>,
        /// Mutating calls made.
        calls: AtomicUsize,
        /// The call (counted from 1) that fails; 0: none.
        fail_at: AtomicUsize,
        /// Puts wait while this says `false`.
        open: tokio::sync::watch::Sender<bool>,
    }

    impl FaultyStore {
        pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
            Self {
                inner,
                calls: AtomicUsize::new(0),
                fail_at: AtomicUsize::new(0),
                open: tokio::sync::watch::channel(true).0,
            }
        }

        /// Makes the `n`-th mutating call from now fail (0: none).
        pub fn fail_call(&self, n: usize) {
            self.calls.store(0, Ordering::SeqCst);
            self.fail_at.store(n, Ordering::SeqCst);
        }

        /// Holds every put until [`FaultyStore::release`] (a stalled upload).
        pub fn hold(&self) {
            self.open.send_replace(false);
        }

        pub fn release(&self) {
            self.open.send_replace(true);
        }

        async fn call(&self, what: &str, location: &Path) -> object_store::Result<()> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n == self.fail_at.load(Ordering::SeqCst) {
                return Err(object_store::Error::Generic {
                    store: "faulty",
                    source: format!("injected failure of {what} {location} (call {n})").into(),
                });
            }
            Ok(())
        }

        async fn wait_open(&self) {
            let mut open = self.open.subscribe();
            let _ = open.wait_for(|open| *open).await;
        }
    }

    impl fmt::Display for FaultyStore {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "FaultyStore({})", self.inner)
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for FaultyStore {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            self.wait_open().await;
            self.call("put", location).await?;
            self.inner.put_opts(location, payload, opts).await
        }

        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.wait_open().await;
            self.call("multipart put", location).await?;
            self.inner.put_multipart_opts(location, opts).await
        }

        async fn get_opts(
            &self,
            location: &Path,
            options: GetOptions,
        ) -> object_store::Result<GetResult> {
            self.inner.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n == self.fail_at.load(Ordering::SeqCst) {
                return futures::stream::once(async move {
                    Err(object_store::Error::Generic {
                        store: "faulty",
                        source: format!("injected failure of a delete (call {n})").into(),
                    })
                })
                .boxed();
            }
            self.inner.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.inner.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.call("copy", to).await?;
            self.inner.copy_opts(from, to, options).await
        }
    }
}

#[cfg(test)]
mod tests {
    use object_store::PutPayload;
    use object_store::memory::InMemory;

    use super::*;

    #[test]
    fn urls_are_told_from_paths() {
        assert!(is_url(Path::new("s3://bucket/ds")));
        assert!(is_url(Path::new("gs://bucket/ds")));
        assert!(!is_url(Path::new("/data/ds")));
        assert!(!is_url(Path::new("ds/s3://x")));
        assert_eq!(local_or_url("file:///data/ds"), PathBuf::from("/data/ds"));
        assert_eq!(local_or_url("s3://b/ds"), PathBuf::from("s3://b/ds"));
    }

    #[test]
    fn an_object_is_listed_read_and_read_by_ranges() {
        let store = Arc::new(InMemory::new());
        register_memory_store("storage-unit", store.clone());
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        block({
            let store = store.clone();
            let bytes = bytes.clone();
            async move {
                let put = |p: &str, b: Vec<u8>| {
                    let store = store.clone();
                    let p = ObjectPath::from(p);
                    async move { store.put(&p, PutPayload::from(b)).await.unwrap() }
                };
                put("ds/snapshot/a.parquet", bytes).await;
                put("ds/dataset.json", b"{}".to_vec()).await;
            }
        })
        .unwrap();
        let root = Path::new("memory://storage-unit/ds");
        let mut entries = list(root).unwrap().unwrap();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].name, "dataset.json");
        assert!(entries[0].is_file);
        assert_eq!(entries[1].name, "snapshot");
        assert!(!entries[1].is_file);
        assert!(
            list(Path::new("memory://storage-unit/none"))
                .unwrap()
                .is_none()
        );
        assert_eq!(
            read(&root.join("dataset.json")).unwrap().unwrap().as_ref(),
            b"{}"
        );
        assert!(read(&root.join("nope.json")).unwrap().is_none());
        let file = open(&root.join("snapshot/a.parquet")).unwrap();
        assert_eq!(file.len(), 10_000);
        assert_eq!(file.get_bytes(100, 5).unwrap().as_ref(), &bytes[100..105]);
        assert!(file.get_bytes(9_998, 5).is_err());
        let mut all = Vec::new();
        file.get_read(3).unwrap().read_to_end(&mut all).unwrap();
        assert_eq!(all, bytes[3..]);
        let missing = open(&root.join("snapshot/none.parquet")).err().unwrap();
        assert!(missing.to_string().contains("none.parquet"), "{missing}");
    }
}
