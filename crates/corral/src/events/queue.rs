//! The bounded queue between publishers (RPC handlers, exit and OOM watchers) and the one task
//! that forwards events to containerd.
//!
//! Why a bound: while containerd's events service is slow or hung (each forward waits up to 5 s),
//! a container that OOMs in a loop, or a pod whose containers keep exiting, would otherwise grow
//! the queue without limit in a process that lives as long as the pod.
//!
//! The policy, in order:
//! 1. an OOM event for a container that already has one waiting in the queue is coalesced into
//!    it: containerd's CRI only marks the container OOMKilled, once is as good as many;
//! 2. below [`CAPACITY`] every other event is queued;
//! 3. when full, the event of least value goes, the oldest of its kind first: paused/resumed
//!    (only `ctr events` subscribers read them), then OOM, then everything else (create, start,
//!    exec-added, exec-started, exit, delete: containerd waits for `/tasks/exit` and keeps its
//!    task records by them). A new event is dropped only when everything queued is worth more;
//!    an exit or delete event therefore goes only when the whole queue is exits and the like,
//!    and then the oldest one goes, the most likely to be stale.
//!
//! Drops are counted; the forwarder reports the counts in a warn line when it next takes an
//! event, and the first drop of a burst is logged when it happens.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Notify;

use super::{Event, Value};

/// Events that fit in the queue. A pod's normal traffic is a few events per container and per
/// exec; even a pod of 50 containers, each restarting and with exec probes, stays far below this
/// while containerd keeps up. Each queued event costs about 100 to 300 bytes (ids, bundle path),
/// so a full queue is at most ~300 KiB, and the deque is only that large while it is backlogged.
pub const CAPACITY: usize = 1024;

/// What [`Queue::push`] did with an event.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// An OOM event merged into the one already queued for the same container.
    Coalesced,
    /// Queued after dropping this older event (its topic) to make room.
    Evicted(&'static str),
    /// Not queued: the queue was full of events worth more.
    Dropped,
}

/// Counts of events lost since the last report.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Losses {
    /// Dropped because the queue was full.
    pub dropped: u64,
    /// OOM repeats merged into a queued OOM event of the same container.
    pub coalesced: u64,
}

impl Losses {
    pub fn is_empty(&self) -> bool {
        self.dropped == 0 && self.coalesced == 0
    }
}

struct Inner {
    events: VecDeque<Event>,
    capacity: usize,
    losses: Losses,
}

pub struct Queue {
    inner: Mutex<Inner>,
    ready: Notify,
}

impl Queue {
    pub fn new(capacity: usize) -> Queue {
        Queue {
            inner: Mutex::new(Inner { events: VecDeque::new(), capacity, losses: Losses::default() }),
            ready: Notify::new(),
        }
    }

    /// Never blocks beyond the short lock: publishing must not stall an RPC. Also says how many
    /// events were dropped for lack of room since the last report, this one included: 1 marks
    /// the first loss of a burst.
    pub fn push(&self, event: Event) -> (Pushed, u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let pushed = inner.push(event);
        match pushed {
            Pushed::Coalesced => inner.losses.coalesced += 1,
            Pushed::Evicted(_) | Pushed::Dropped => inner.losses.dropped += 1,
            Pushed::Queued => {}
        }
        let dropped = inner.losses.dropped;
        drop(inner);
        if !matches!(pushed, Pushed::Coalesced | Pushed::Dropped) {
            // A permit is stored if the forwarder is not waiting yet, so no wake-up is lost.
            self.ready.notify_one();
        }
        (pushed, dropped)
    }

    /// The next event, with the losses counted since the last call (to be reported).
    pub async fn pop(&self) -> (Event, Losses) {
        loop {
            {
                let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(event) = inner.events.pop_front() {
                    return (event, std::mem::take(&mut inner.losses));
                }
            }
            self.ready.notified().await;
        }
    }

    #[cfg(test)]
    fn topics(&self) -> Vec<(&'static str, String)> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.events.iter().map(|e| (e.topic, e.container_id.clone())).collect()
    }
}

impl Inner {
    fn push(&mut self, event: Event) -> Pushed {
        let value = event.value();
        if value == Value::Oom
            && self.events.iter().any(|e| e.value() == Value::Oom && e.container_id == event.container_id)
        {
            return Pushed::Coalesced;
        }
        if self.events.len() < self.capacity {
            self.events.push_back(event);
            return Pushed::Queued;
        }
        // The oldest of the least valuable queued events (min_by_key keeps the first of equals).
        let victim =
            self.events.iter().enumerate().min_by_key(|(_, e)| e.value()).map(|(i, e)| (i, e.value()));
        match victim {
            Some((i, victim_value)) if victim_value <= value => {
                let topic = self.events.remove(i).map(|e| e.topic).unwrap_or_default();
                self.events.push_back(event);
                Pushed::Evicted(topic)
            }
            _ => Pushed::Dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn exit(id: &str) -> Event {
        Event::exit(id, id, 10, 0, SystemTime::now())
    }

    #[test]
    fn oom_repeats_for_one_container_are_coalesced_others_queued() {
        let q = Queue::new(8);
        assert_eq!(q.push(Event::oom("a")).0, Pushed::Queued);
        assert_eq!(q.push(Event::oom("a")).0, Pushed::Coalesced);
        assert_eq!(q.push(Event::oom("b")).0, Pushed::Queued);
        assert_eq!(q.push(Event::oom("a")).0, Pushed::Coalesced);
        assert_eq!(q.topics(), [("/tasks/oom", "a".into()), ("/tasks/oom", "b".into())]);
    }

    #[tokio::test]
    async fn an_oom_after_the_queued_one_was_sent_is_queued_again() {
        let q = Queue::new(8);
        q.push(Event::oom("a"));
        q.push(Event::oom("a"));
        let (first, losses) = q.pop().await;
        assert_eq!(first.topic, "/tasks/oom");
        assert_eq!(losses, Losses { dropped: 0, coalesced: 1 });
        assert_eq!(q.push(Event::oom("a")).0, Pushed::Queued);
    }

    #[test]
    fn an_oom_loop_does_not_grow_the_queue() {
        let q = Queue::new(CAPACITY);
        for _ in 0..100_000 {
            q.push(Event::oom("looping"));
        }
        assert_eq!(q.topics().len(), 1);
    }

    #[test]
    fn when_full_low_value_events_go_before_exits_oldest_first() {
        let q = Queue::new(4);
        q.push(Event::paused("a"));
        q.push(exit("b"));
        q.push(Event::oom("c"));
        q.push(Event::resumed("a"));
        // Full: the oldest paused/resumed goes for an exit.
        assert_eq!(q.push(exit("d")).0, Pushed::Evicted("/tasks/paused"));
        assert_eq!(q.push(Event::delete("b", 10, 0, SystemTime::now())).0, Pushed::Evicted("/tasks/resumed"));
        // Then the OOM, the least valuable left.
        assert_eq!(q.push(exit("e")).0, Pushed::Evicted("/tasks/oom"));
        assert_eq!(
            q.topics(),
            [
                ("/tasks/exit", "b".into()),
                ("/tasks/exit", "d".into()),
                ("/tasks/delete", "b".into()),
                ("/tasks/exit", "e".into())
            ]
        );
    }

    #[test]
    fn a_new_low_value_event_is_dropped_when_everything_queued_is_worth_more() {
        let q = Queue::new(2);
        q.push(exit("a"));
        q.push(Event::oom("b"));
        assert_eq!(q.push(Event::paused("c")).0, Pushed::Dropped);
        // An OOM may replace an older OOM (the newer one is about a live problem) ...
        assert_eq!(q.push(Event::oom("d")).0, Pushed::Evicted("/tasks/oom"));
        // ... but never an exit.
        assert_eq!(q.push(Event::resumed("c")).0, Pushed::Dropped);
        assert_eq!(q.topics(), [("/tasks/exit", "a".into()), ("/tasks/oom", "d".into())]);
    }

    #[test]
    fn a_queue_full_of_exits_drops_the_oldest_exit() {
        let q = Queue::new(2);
        q.push(exit("a"));
        q.push(Event::exec_added("b", "e1"));
        assert_eq!(q.push(exit("c")).0, Pushed::Evicted("/tasks/exit"));
        assert_eq!(q.topics(), [("/tasks/exec-added", "b".into()), ("/tasks/exit", "c".into())]);
    }

    #[tokio::test]
    async fn losses_are_counted_and_reported_once() {
        let q = Queue::new(1);
        q.push(exit("a"));
        assert_eq!(q.push(Event::paused("a")), (Pushed::Dropped, 1));
        assert_eq!(q.push(exit("b")), (Pushed::Evicted("/tasks/exit"), 2));
        let (event, losses) = q.pop().await;
        assert_eq!(event.container_id, "b");
        assert_eq!(losses, Losses { dropped: 2, coalesced: 0 });
        q.push(exit("c"));
        let (_, losses) = q.pop().await;
        assert!(losses.is_empty());
    }

    #[tokio::test]
    async fn pop_waits_for_a_push() {
        let q = std::sync::Arc::new(Queue::new(4));
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.pop().await.0.container_id }
        });
        tokio::task::yield_now().await;
        q.push(exit("late"));
        let id = tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await.unwrap().unwrap();
        assert_eq!(id, "late");
    }
}
