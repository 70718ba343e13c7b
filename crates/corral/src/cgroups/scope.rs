//! The holder's cgroup under the systemd driver: a transient scope `corral-<sandbox id>.scope`
//! in the pod's slice, which systemd makes, moves the holder into and gives the sandbox's
//! resources, as runc asks systemd for each container's scope. Under that driver systemd owns
//! the slices and everything in them; a cgroup it did not make inside a slice breaks its
//! delegation rules (it may take the slice's controllers back when it re-realizes the slice,
//! and it never removes such a directory).
//!
//! corral talks to systemd over its private socket, as root, without the system bus: it needs
//! no bus daemon and systemd sends every job's completion to its private connections unasked.

use std::path::Path;
use std::time::Duration;

use tracing::debug;

use super::{shares_to_weight, Resources};
use crate::error::{Error, Result};
use crate::sys::dbus::{Call, Connection, DbusError, Encoder, Message, SIGNAL};

pub const SYSTEMD_SOCKET: &str = "/run/systemd/private";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const DESTINATION: &str = "org.freedesktop.systemd1";

/// How long one exchange with systemd (a call and its job) may take. systemd answers in
/// milliseconds; a software-emulated node under load takes seconds.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The scope's unit name for a sandbox.
pub fn unit_name(sandbox_id: &str) -> String {
    format!("corral-{sandbox_id}.scope")
}

/// A unit property's value, of the few types corral sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Str(String),
    Bool(bool),
    I32(i32),
    U64(u64),
    Pids(Vec<u32>),
}

/// The scope's properties: its slice, the holder, the accounting that keeps the slice's
/// controllers enabled, and the sandbox's resources in systemd's terms for the host's cgroup
/// version (containerd gives the pause container 2 CPU shares when the pod says nothing, and
/// so does corral).
pub fn properties(
    v2: bool,
    slice: &str,
    sandbox_id: &str,
    pid: u32,
    res: &Resources,
) -> Vec<(&'static str, Value)> {
    let mut props = vec![
        ("Description", Value::Str(format!("corral pod sandbox {sandbox_id}"))),
        ("Slice", Value::Str(slice.to_string())),
        ("PIDs", Value::Pids(vec![pid])),
        // Not ordered against shutdown.target and the like: kubelet, not systemd, ends pods.
        ("DefaultDependencies", Value::Bool(false)),
        // The holder has nothing to flush, and as pid 1 of a shared pid namespace it would
        // ignore SIGTERM: a stop (corral's, or an operator's `systemctl stop`) ends it at once
        // instead of after systemd's 90 s stop timeout.
        ("KillSignal", Value::I32(libc::SIGKILL)),
        ("CPUAccounting", Value::Bool(true)),
        ("MemoryAccounting", Value::Bool(true)),
        ("TasksAccounting", Value::Bool(true)),
    ];
    let shares = res.cpu_shares.unwrap_or(2);
    props.push(match v2 {
        true => ("CPUWeight", Value::U64(shares_to_weight(shares))),
        false => ("CPUShares", Value::U64(shares)),
    });
    if let Some(quota) = res.cpu_quota.filter(|q| *q > 0) {
        let period = res.cpu_period.unwrap_or(100_000);
        // systemd keeps the quota per second in steps of 10 ms: round up, as runc does, so
        // the pod never gets less than it asked for.
        let per_sec = (quota as u64 * 1_000_000 / period).div_ceil(10_000) * 10_000;
        props.push(("CPUQuotaPerSecUSec", Value::U64(per_sec)));
        props.push(("CPUQuotaPeriodUSec", Value::U64(period)));
    }
    if let Some(limit) = res.memory_limit.filter(|l| *l > 0) {
        props.push((if v2 { "MemoryMax" } else { "MemoryLimit" }, Value::U64(limit as u64)));
    }
    props
}

/// Asks systemd for the scope and waits until it runs with the holder in it. A scope of the
/// same name left by an earlier attempt with this sandbox id is stopped first.
pub fn start(unit: &str, props: &[(&'static str, Value)]) -> Result<()> {
    let mut conn = connect(unit)?;
    match start_once(&mut conn, unit, props) {
        Err(DbusError::Remote { name, .. }) if name == "org.freedesktop.systemd1.UnitExists" => {
            debug!(unit, "a scope of this name exists; stopping it and asking again");
            stop_on(&mut conn, unit).map_err(|e| failed(unit, "stop the old scope", e))?;
            start_once(&mut conn, unit, props)
        }
        other => other,
    }
    .map_err(|e| failed(unit, "start", e))
}

fn start_once(conn: &mut Connection, unit: &str, props: &[(&'static str, Value)]) -> Result<(), DbusError> {
    let mut body = Encoder::default();
    body.string(unit);
    body.string("fail");
    body.array(8, |e| {
        for (name, value) in props {
            e.structure(|e| {
                e.string(name);
                encode_value(e, value);
            });
        }
    });
    // No auxiliary units.
    body.array(8, |_| {});
    let call = manager_call("StartTransientUnit", "ssa(sv)a(sa(sv))", body);
    run_job(conn, &call)
}

fn encode_value(e: &mut Encoder, value: &Value) {
    match value {
        Value::Str(s) => e.variant("s", |e| e.string(s)),
        Value::Bool(b) => e.variant("b", |e| e.boolean(*b)),
        Value::I32(v) => e.variant("i", |e| e.u32(*v as u32)),
        Value::U64(v) => e.variant("t", |e| e.u64(*v)),
        Value::Pids(pids) => e.variant("au", |e| e.array(4, |e| pids.iter().for_each(|p| e.u32(*p)))),
    }
}

/// Stops the scope (killing what is left in it) and clears a failed state, so no unit stays
/// loaded. A scope systemd has already collected (its last process exited) is fine.
pub fn stop(unit: &str) -> Result<()> {
    let mut conn = connect(unit)?;
    stop_on(&mut conn, unit).map_err(|e| failed(unit, "stop", e))
}

fn stop_on(conn: &mut Connection, unit: &str) -> Result<(), DbusError> {
    let mut body = Encoder::default();
    body.string(unit);
    body.string("replace");
    match run_job(conn, &manager_call("StopUnit", "ss", body)) {
        Err(DbusError::Remote { name, .. }) if name == "org.freedesktop.systemd1.NoSuchUnit" => {}
        other => other?,
    }
    let mut body = Encoder::default();
    body.string(unit);
    match conn.call(&manager_call("ResetFailedUnit", "s", body), |_| {}) {
        Err(DbusError::Remote { name, .. }) if name == "org.freedesktop.systemd1.NoSuchUnit" => Ok(()),
        other => other.map(|_| ()),
    }
}

/// systemd's version, asked over the private socket: whether corral can reach systemd at all.
pub fn systemd_version() -> Result<String, DbusError> {
    let mut conn = Connection::connect(Path::new(SYSTEMD_SOCKET), TIMEOUT)?;
    let mut body = Encoder::default();
    body.string(MANAGER);
    body.string("Version");
    let call = Call {
        destination: DESTINATION,
        path: MANAGER_PATH,
        interface: "org.freedesktop.DBus.Properties",
        member: "Get",
        signature: "ss",
        body: body.into_bytes(),
    };
    let reply = conn.call(&call, |_| {})?;
    let mut body = reply.body();
    match body.signature()?.as_str() {
        "s" => body.string(),
        other => Err(DbusError::Protocol(format!("Version is of type {other:?}"))),
    }
}

fn connect(unit: &str) -> Result<Connection> {
    Connection::connect(Path::new(SYSTEMD_SOCKET), TIMEOUT).map_err(|e| {
        failed(unit, &format!("reach systemd at {SYSTEMD_SOCKET} (cgroup_parent is a slice)"), e)
    })
}

fn failed(unit: &str, step: &str, e: DbusError) -> Error {
    match e {
        DbusError::Io(source) => Error::io(format!("systemd scope {unit}: {step}"), source),
        other => Error::Io {
            what: format!("systemd scope {unit}: {step}"),
            source: std::io::Error::other(other.to_string()),
        },
    }
}

fn manager_call<'a>(member: &'a str, signature: &'a str, body: Encoder) -> Call<'a> {
    Call {
        destination: DESTINATION,
        path: MANAGER_PATH,
        interface: MANAGER,
        member,
        signature,
        body: body.into_bytes(),
    }
}

/// Sends a call that answers with a job's path and waits for the job's `JobRemoved` signal,
/// which may come before the answer is read. A job that ends other than "done" is an error.
fn run_job(conn: &mut Connection, call: &Call<'_>) -> Result<(), DbusError> {
    let mut finished: Vec<(String, String)> = Vec::new();
    let reply = conn.call(call, |msg| finished.extend(job_removed(msg)))?;
    let job = reply.body().string()?;
    debug!(member = call.member, job, "systemd job queued");
    let result = loop {
        if let Some((_, result)) = finished.iter().find(|(path, _)| *path == job) {
            break result.clone();
        }
        let msg = conn.receive()?;
        finished.extend(job_removed(&msg));
    };
    match result.as_str() {
        "done" => Ok(()),
        other => Err(DbusError::Protocol(format!("systemd's job {job} ended {other:?}"))),
    }
}

/// (job path, result) of a `JobRemoved(u id, o job, s unit, s result)` signal.
fn job_removed(msg: &Message) -> Option<(String, String)> {
    if msg.kind != SIGNAL || msg.member != "JobRemoved" || msg.interface != MANAGER || msg.signature != "uoss"
    {
        return None;
    }
    let mut body = msg.body();
    let _id = body.u32().ok()?;
    let job = body.string().ok()?;
    let _unit = body.string().ok()?;
    let result = body.string().ok()?;
    Some((job, result))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_say_the_resources_in_each_versions_terms() {
        let res = Resources {
            cpu_shares: Some(512),
            cpu_quota: Some(25_000),
            cpu_period: Some(100_000),
            memory_limit: Some(1 << 28),
        };
        let v2 = properties(true, "kubepods-pod1.slice", "sb", 42, &res);
        let get = |props: &[(&str, Value)], name: &str| {
            props.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone())
        };
        assert_eq!(get(&v2, "Slice"), Some(Value::Str("kubepods-pod1.slice".into())));
        assert_eq!(get(&v2, "PIDs"), Some(Value::Pids(vec![42])));
        assert_eq!(get(&v2, "CPUWeight"), Some(Value::U64(shares_to_weight(512))));
        assert_eq!(get(&v2, "CPUQuotaPerSecUSec"), Some(Value::U64(250_000)));
        assert_eq!(get(&v2, "MemoryMax"), Some(Value::U64(1 << 28)));
        assert_eq!(get(&v2, "CPUShares"), None);
        let v1 = properties(false, "kubepods-pod1.slice", "sb", 42, &res);
        assert_eq!(get(&v1, "CPUShares"), Some(Value::U64(512)));
        assert_eq!(get(&v1, "MemoryLimit"), Some(Value::U64(1 << 28)));
        assert_eq!(get(&v1, "MemoryMax"), None);
        // Nothing asked: the pause container's 2 shares, no quota, no limit.
        let none = properties(true, "s.slice", "sb", 1, &Resources::default());
        assert_eq!(get(&none, "CPUWeight"), Some(Value::U64(1)));
        assert_eq!(get(&none, "CPUQuotaPerSecUSec"), None);
        assert_eq!(get(&none, "MemoryMax"), None);
    }

    #[test]
    fn a_quota_between_systemds_steps_is_rounded_up() {
        let res = Resources { cpu_quota: Some(12_345), cpu_period: Some(100_000), ..Default::default() };
        let props = properties(true, "s.slice", "sb", 1, &res);
        let quota = props.iter().find(|(n, _)| *n == "CPUQuotaPerSecUSec").map(|(_, v)| v.clone());
        assert_eq!(quota, Some(Value::U64(130_000)));
    }

    #[test]
    fn job_removed_signals_are_read() {
        let mut body = Encoder::default();
        body.u32(9);
        body.string("/org/freedesktop/systemd1/job/9");
        body.string("corral-sb.scope");
        body.string("done");
        let msg = Message::for_test(SIGNAL, MANAGER, "JobRemoved", "uoss", body.into_bytes());
        assert_eq!(job_removed(&msg), Some(("/org/freedesktop/systemd1/job/9".into(), "done".into())));
        let other = Message::for_test(SIGNAL, MANAGER, "UnitNew", "so", vec![]);
        assert_eq!(job_removed(&other), None);
    }
}
