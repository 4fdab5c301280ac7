//! Reading ahead on a thread of its own: Parquet decoding overlaps with what consumes it.
//!
//! ```text
//!   reader thread:  decode batch 1 | decode batch 2 | decode batch 3 | ...
//!                          │  bounded queue (depth items)
//!   caller:                └──▶ load batch 1 | load batch 2 | ...
//! ```
//!
//! [`Prefetch`] runs an iterator on a named thread and hands its items over a bounded queue,
//! in order: a replay's snapshot load (hashing, key encoding, sorting runs, writing them),
//! its validation (an external sort) and its upstream source each keep one core busy while
//! the reader keeps the other decoding the next batches. The queue bounds the memory to
//! `depth` items ahead. Errors travel as items, so the first error still ends the stream
//! where it was met. Dropping the [`Prefetch`] stops the reader at its next item and waits
//! for it, so no file stays open behind the caller's back.
//!
//! [`tee`] is the same for two consumers of one read: every item reaches both, in order
//! (a replay's snapshot, decoded once for its load and its validation).

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::Result;

/// An iterator run ahead on its own thread. See the module docs.
#[derive(Debug)]
pub(crate) struct Prefetch<T> {
    items: Option<Receiver<T>>,
    reader: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Prefetch<T> {
    /// Runs `source` on a thread named `name`, at most `depth` (at least 1) items ahead of
    /// the caller.
    pub fn new<I>(name: &str, depth: usize, source: I) -> Result<Self>
    where
        I: Iterator<Item = T> + Send + 'static,
    {
        let (tx, rx) = sync_channel(depth.max(1));
        let reader = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || feed(source, &tx))?;
        Ok(Self {
            items: Some(rx),
            reader: Some(reader),
        })
    }
}

/// Sends every item of `source` until it ends or the receiver is gone.
fn feed<T>(source: impl Iterator<Item = T>, tx: &SyncSender<T>) {
    for item in source {
        if tx.send(item).is_err() {
            return;
        }
    }
}

impl<T> Iterator for Prefetch<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        // A reader that ended, or panicked, closes the queue: the stream ends there (a panic
        // is re-raised when the reader is joined on drop).
        self.items.as_ref()?.recv().ok()
    }
}

impl<T> Drop for Prefetch<T> {
    fn drop(&mut self) {
        // Closing the queue first makes a reader blocked on a full queue give up.
        drop(self.items.take());
        if let Some(reader) = self.reader.take()
            && let Err(panic) = reader.join()
            && !std::thread::panicking()
        {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Runs `source` on a thread named `name` for two consumers: `split` makes each item into
/// the first's copy and the second's (a record batch clones its buffers' handles, not its
/// rows). Each consumer is at most `depth` items behind the reader, so the slower one paces
/// it. A consumer dropped early stops receiving, the other goes on; the reader stops when
/// both are gone, and the last one dropped waits for it.
pub(crate) fn tee<T, I>(
    name: &str,
    depth: usize,
    source: I,
    split: impl Fn(T) -> (T, T) + Send + 'static,
) -> Result<(Teed<T>, Teed<T>)>
where
    T: Send + 'static,
    I: Iterator<Item = T> + Send + 'static,
{
    let (first_tx, first_rx) = sync_channel(depth.max(1));
    let (second_tx, second_rx) = sync_channel(depth.max(1));
    let reader = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let (mut first, mut second) = (Some(first_tx), Some(second_tx));
            for item in source {
                let (a, b) = split(item);
                // A send fails once its consumer is gone: that one is left out from then on.
                if first.as_ref().is_some_and(|tx| tx.send(a).is_err()) {
                    first = None;
                }
                if second.as_ref().is_some_and(|tx| tx.send(b).is_err()) {
                    second = None;
                }
                if first.is_none() && second.is_none() {
                    return;
                }
            }
        })?;
    let reader = Arc::new(Mutex::new(Some(reader)));
    Ok((
        Teed {
            items: Some(first_rx),
            reader: reader.clone(),
        },
        Teed {
            items: Some(second_rx),
            reader,
        },
    ))
}

/// One consumer's side of a [`tee`].
#[derive(Debug)]
pub(crate) struct Teed<T> {
    items: Option<Receiver<T>>,
    /// The reader thread, joined by the consumer dropped last.
    reader: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl<T> Iterator for Teed<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.items.as_ref()?.recv().ok()
    }
}

impl<T> Drop for Teed<T> {
    fn drop(&mut self) {
        drop(self.items.take());
        let reader = std::mem::replace(&mut self.reader, Arc::new(Mutex::new(None)));
        // Only the last consumer gets the handle: the reader may be waiting for the other
        // one to take an item until then.
        let Some(handle) = Arc::into_inner(reader)
            .and_then(|m| m.into_inner().ok())
            .flatten()
        else {
            return;
        };
        if let Err(panic) = handle.join()
            && !std::thread::panicking()
        {
            std::panic::resume_unwind(panic);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn items_arrive_in_order_errors_included() {
        let source = (0..1000).map(|i| if i == 500 { Err(i) } else { Ok(i) });
        let got: Vec<std::result::Result<i32, i32>> =
            Prefetch::new("test-read", 3, source).unwrap().collect();
        assert_eq!(got.len(), 1000);
        assert_eq!(got[500], Err(500));
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, r)| i == 500 || *r == Ok(i as i32))
        );
    }

    #[test]
    fn both_sides_of_a_tee_get_every_item_and_one_may_leave_early() {
        let source = (0..1000).map(|i| if i == 700 { Err(i) } else { Ok(i) });
        let split = |item: std::result::Result<i32, i32>| (item, item.map_err(|e| -e));
        let (first, mut second) = tee("test-tee", 3, source, split).unwrap();
        let reader = std::thread::spawn(move || first.collect::<Vec<_>>());
        // The second consumer takes a few items and leaves; the first still gets them all.
        assert_eq!(second.next(), Some(Ok(0)));
        assert_eq!(second.next(), Some(Ok(1)));
        drop(second);
        let got = reader.join().unwrap();
        assert_eq!(got.len(), 1000);
        assert_eq!(got[700], Err(700));
        assert_eq!(got[999], Ok(999));
    }

    #[test]
    fn a_tee_whose_consumers_both_leave_stops_its_reader() {
        let source = 0..usize::MAX;
        let (mut first, second) = tee("test-tee", 2, source, |i| (i, i)).unwrap();
        assert_eq!(first.next(), Some(0));
        drop(second);
        // Dropping the last side joins the reader, which would never end on its own.
        drop(first);
    }

    #[test]
    fn the_reader_stays_at_most_depth_items_ahead_and_stops_when_dropped() {
        let produced = Arc::new(AtomicUsize::new(0));
        let counter = produced.clone();
        let source = (0..usize::MAX).inspect(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let mut prefetch = Prefetch::new("test-read", 2, source).unwrap();
        assert_eq!(prefetch.next(), Some(0));
        assert_eq!(prefetch.next(), Some(1));
        // Two queued, one in the reader's hands waiting for room, at most.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(produced.load(Ordering::SeqCst) <= 2 + 2 + 1);
        // Dropping joins the reader, which would never end on its own.
        drop(prefetch);
    }
}
