//! Task events forwarded to containerd (`containerd.services.events.ttrpc.v1.Events/Forward` on
//! TTRPC_ADDRESS). Publishing never blocks an RPC: events go into a bounded queue (`queue.rs`
//! says what is dropped when it is full) that one task drains, connecting lazily and dropping
//! events (with a log line) while containerd is unreachable.

mod queue;

use std::sync::Arc;
use std::time::SystemTime;

use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskOOM, TaskPaused, TaskResumed,
    TaskStart,
};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim_protos::protobuf::{Message, MessageField};
use containerd_shim_protos::shim::event::Envelope;
use containerd_shim_protos::shim::events::ForwardRequest;
use containerd_shim_protos::shim_async::EventsClient;
use containerd_shim_protos::ttrpc::context;
use tracing::{debug, warn};

use queue::{Losses, Pushed, Queue};

/// A typed event ready to be wrapped in an envelope.
pub struct Event {
    topic: &'static str,
    /// The container it is about: what OOM repeats are coalesced by.
    container_id: String,
    payload: Any,
}

/// What losing an event costs containerd, least first: the order in which a full queue drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Value {
    /// paused, resumed: read by `ctr events` subscribers, not by CRI.
    Info,
    /// CRI marks the container OOMKilled from it.
    Oom,
    /// create, start, exec-added, exec-started, exit, delete: containerd's task records, and
    /// the exits it waits for.
    Lifecycle,
}

fn any<M: Message>(type_url: &str, msg: &M) -> Any {
    let mut a = Any::new();
    a.type_url = type_url.to_string();
    a.value = msg.write_to_bytes().unwrap_or_default();
    a
}

pub fn timestamp(t: SystemTime) -> MessageField<Timestamp> {
    MessageField::some(Timestamp::from(t))
}

impl Event {
    fn value(&self) -> Value {
        match self.topic {
            "/tasks/paused" | "/tasks/resumed" => Value::Info,
            "/tasks/oom" => Value::Oom,
            _ => Value::Lifecycle,
        }
    }

    pub fn create(id: &str, bundle: &str, pid: u32) -> Event {
        let msg = TaskCreate { container_id: id.into(), bundle: bundle.into(), pid, ..Default::default() };
        Event {
            topic: "/tasks/create",
            container_id: id.into(),
            payload: any("containerd.events.TaskCreate", &msg),
        }
    }
    pub fn start(id: &str, pid: u32) -> Event {
        let msg = TaskStart { container_id: id.into(), pid, ..Default::default() };
        Event {
            topic: "/tasks/start",
            container_id: id.into(),
            payload: any("containerd.events.TaskStart", &msg),
        }
    }
    pub fn oom(container_id: &str) -> Event {
        let msg = TaskOOM { container_id: container_id.into(), ..Default::default() };
        Event {
            topic: "/tasks/oom",
            container_id: container_id.into(),
            payload: any("containerd.events.TaskOOM", &msg),
        }
    }
    pub fn paused(container_id: &str) -> Event {
        let msg = TaskPaused { container_id: container_id.into(), ..Default::default() };
        Event {
            topic: "/tasks/paused",
            container_id: container_id.into(),
            payload: any("containerd.events.TaskPaused", &msg),
        }
    }
    pub fn resumed(container_id: &str) -> Event {
        let msg = TaskResumed { container_id: container_id.into(), ..Default::default() };
        Event {
            topic: "/tasks/resumed",
            container_id: container_id.into(),
            payload: any("containerd.events.TaskResumed", &msg),
        }
    }
    pub fn exec_added(container_id: &str, exec_id: &str) -> Event {
        let msg = TaskExecAdded {
            container_id: container_id.into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        Event {
            topic: "/tasks/exec-added",
            container_id: container_id.into(),
            payload: any("containerd.events.TaskExecAdded", &msg),
        }
    }
    pub fn exec_started(container_id: &str, exec_id: &str, pid: u32) -> Event {
        let msg = TaskExecStarted {
            container_id: container_id.into(),
            exec_id: exec_id.into(),
            pid,
            ..Default::default()
        };
        Event {
            topic: "/tasks/exec-started",
            container_id: container_id.into(),
            payload: any("containerd.events.TaskExecStarted", &msg),
        }
    }
    /// `id` is the exec id, or the container id for its init.
    pub fn exit(container_id: &str, id: &str, pid: u32, status: u32, at: SystemTime) -> Event {
        let msg = TaskExit {
            container_id: container_id.into(),
            id: id.into(),
            pid,
            exit_status: status,
            exited_at: timestamp(at),
            ..Default::default()
        };
        Event {
            topic: "/tasks/exit",
            container_id: container_id.into(),
            payload: any("containerd.events.TaskExit", &msg),
        }
    }
    pub fn delete(id: &str, pid: u32, status: u32, at: SystemTime) -> Event {
        let msg = TaskDelete {
            container_id: id.into(),
            id: id.into(),
            pid,
            exit_status: status,
            exited_at: timestamp(at),
            ..Default::default()
        };
        Event {
            topic: "/tasks/delete",
            container_id: id.into(),
            payload: any("containerd.events.TaskDelete", &msg),
        }
    }
}

#[derive(Clone)]
pub struct Publisher {
    queue: Arc<Queue>,
}

impl Publisher {
    /// Starts the forwarding task. `address` is containerd's ttrpc socket; `None` drops events.
    pub fn spawn(address: Option<String>, namespace: String) -> Publisher {
        let queue = Arc::new(Queue::new(queue::CAPACITY));
        tokio::spawn(forward(address, namespace, queue.clone()));
        Publisher { queue }
    }

    pub fn publish(&self, event: Event) {
        let topic = event.topic;
        // Only the first loss of a burst is told here; the forwarder reports the count.
        match self.queue.push(event) {
            (Pushed::Evicted(lost), 1) => {
                warn!(
                    lost,
                    kept = topic,
                    capacity = queue::CAPACITY,
                    "events: queue full; dropping the least valuable events"
                )
            }
            (Pushed::Dropped, 1) => {
                warn!(
                    lost = topic,
                    capacity = queue::CAPACITY,
                    "events: queue full; dropping the least valuable events"
                )
            }
            _ => {}
        }
    }
}

fn report(losses: &Losses) {
    if !losses.is_empty() {
        warn!(
            dropped = losses.dropped,
            oom_repeats_coalesced = losses.coalesced,
            "events: {} dropped (queue full) and {} repeated OOM events merged since the last report",
            losses.dropped,
            losses.coalesced
        );
    }
}

async fn forward(address: Option<String>, namespace: String, queue: Arc<Queue>) {
    let mut client: Option<EventsClient> = None;
    loop {
        let (event, losses) = queue.pop().await;
        report(&losses);
        let Some(address) = address.as_deref() else {
            continue;
        };
        if client.is_none() {
            let addr = if address.starts_with("unix://") {
                address.to_string()
            } else {
                format!("unix://{address}")
            };
            match containerd_shim_protos::ttrpc::asynchronous::Client::connect(&addr).await {
                Ok(c) => client = Some(EventsClient::new(c)),
                Err(e) => {
                    warn!(topic = event.topic, error = %e, "events: cannot reach containerd; event dropped");
                    continue;
                }
            }
        }
        let mut envelope = Envelope::new();
        envelope.timestamp = timestamp(SystemTime::now());
        envelope.namespace = namespace.clone();
        envelope.topic = event.topic.to_string();
        envelope.event = MessageField::some(event.payload);
        let req = ForwardRequest { envelope: MessageField::some(envelope), ..Default::default() };
        let c = client.as_ref().expect("connected above");
        match c.forward(context::with_timeout(5_000_000_000), &req).await {
            Ok(_) => debug!(topic = event.topic, "event forwarded"),
            Err(e) => {
                warn!(topic = event.topic, error = %e, "events: forward failed; reconnecting");
                client = None;
            }
        }
    }
}
