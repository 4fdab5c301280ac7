//! Online control of a running job: pause, resume, throttle and rescale from outside; and,
//! for a [`BackfillJob`](crate::BackfillJob), barriers and a stop on request.
//!
//! A [`JobControl`] queues mutations; the job runtime's dispatcher attaches the oldest one to
//! the next barrier that carries none of its own (a `Rescale` waits for the next checkpoint
//! barrier, because the actors restart from committed progress). So a request takes effect
//! at a barrier, for every actor at once, like any mutation.
//!
//! The queue is bounded ([`CONTROL_CAPACITY`]): a request beyond it is refused
//! ([`Error::InvalidConfig`]) rather than queued without limit.

use futures::channel::mpsc;

use crate::chunk::Mutation;
use crate::error::{Error, Result};
use crate::job::dispatcher::VnodeMap;
use crate::job::feeder::Request;
use crate::vnode::{VnodeBitmap, VnodeCount};

/// Requests queued and not yet attached to a barrier, at most.
pub const CONTROL_CAPACITY: usize = 16;

/// A handle that sends control mutations into a running job (cheap to clone).
#[derive(Debug, Clone)]
pub struct JobControl {
    tx: mpsc::Sender<Mutation>,
    vnodes: VnodeCount,
    /// The job's upstream task, for barriers and stops on request.
    requests: Option<mpsc::UnboundedSender<Request>>,
}

impl JobControl {
    pub(crate) fn new(vnodes: VnodeCount) -> (Self, mpsc::Receiver<Mutation>) {
        let (tx, rx) = mpsc::channel(CONTROL_CAPACITY);
        (
            Self {
                tx,
                vnodes,
                requests: None,
            },
            rx,
        )
    }

    /// The same handle, with barriers and stops sent to a job's upstream task.
    pub(crate) fn with_requests(mut self, requests: mpsc::UnboundedSender<Request>) -> Self {
        self.requests = Some(requests);
        self
    }

    fn request(&self, request: Request) -> Result<()> {
        let requests = self.requests.as_ref().ok_or_else(|| {
            Error::InvalidConfig(
                "this job has no upstream task of its own: its source sends the barriers".into(),
            )
        })?;
        requests
            .unbounded_send(request)
            .map_err(|_| Error::Protocol("the job has ended".into()))
    }

    /// Closes the open epoch now (a barrier; a checkpoint when it is due).
    pub fn barrier(&self) -> Result<()> {
        self.request(Request::Barrier)
    }

    /// Closes the open epoch now with a checkpoint.
    pub fn checkpoint(&self) -> Result<()> {
        self.request(Request::Checkpoint)
    }

    /// Ends the job at its next barrier, a checkpoint, whether the backfill has finished or
    /// not: the job can be resumed from it.
    pub fn stop(&self) -> Result<()> {
        self.request(Request::Stop)
    }

    fn send(&self, mutation: Mutation) -> Result<()> {
        self.tx.clone().try_send(mutation).map_err(|e| {
            if e.is_full() {
                Error::InvalidConfig(format!(
                    "{CONTROL_CAPACITY} control requests are already waiting for a barrier"
                ))
            } else {
                Error::Protocol("the job has ended".into())
            }
        })
    }

    /// Stops reading the snapshot (upstream changes keep flowing) from the next barrier.
    pub fn pause(&self) -> Result<()> {
        self.send(Mutation::Pause)
    }

    /// Undoes [`JobControl::pause`] at the next barrier.
    pub fn resume(&self) -> Result<()> {
        self.send(Mutation::Resume)
    }

    /// Limits the job's snapshot reading to `rows_per_second` (`None`: no limit; `0`: the
    /// snapshot side pauses) from the next barrier. The limit is the job's, shared by its
    /// actors.
    pub fn throttle(&self, rows_per_second: Option<u64>) -> Result<()> {
        self.send(Mutation::Throttle { rows_per_second })
    }

    /// Moves to `actors` actors over even vnode ranges at the next checkpoint barrier.
    pub fn rescale(&self, actors: usize) -> Result<()> {
        let map = VnodeMap::even(self.vnodes, actors)?;
        self.send(Mutation::Rescale {
            actors: map.sets().to_vec(),
        })
    }

    /// Moves to these vnode sets (one per actor; they must partition the vnodes) at the next
    /// checkpoint barrier.
    pub fn rescale_to(&self, actors: Vec<VnodeBitmap>) -> Result<()> {
        VnodeMap::new(self.vnodes, actors.clone())?;
        self.send(Mutation::Rescale { actors })
    }
}
