// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The control channel (`--control-socket`): the host side of the device, for developers and
//! test scripts. JSON lines on a unix socket: one request object per line, one reply per
//! line, `{"error": "..."}` when a request is refused. `cxl-accel ctl` is its client.
//!
//! It reports (device info, counters and per-opcode latency, buffers), traces commands, and
//! injects faults (see `faults.rs`). The socket is the daemon user's alone (0600), like the
//! vhost-user socket: whoever reaches it controls the device.

pub mod ctl;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::device::cxl::RasError;
use crate::device::faults::{Action, Model, RuleSpec, Trigger};
use crate::device::Device;
use crate::host::poll::wait_readable;
use crate::protocol::{self, Status};

/// The commands of the channel, named once for the daemon and `cxl-accel ctl`.
pub mod cmd {
    pub const INFO: &str = "info";
    pub const COUNTERS: &str = "counters";
    pub const TRACE: &str = "trace";
    pub const BUFFERS: &str = "buffers";
    pub const FAULTS: &str = "faults";
    pub const FAULT_ADD: &str = "fault-add";
    pub const FAULT_CLEAR: &str = "fault-clear";
    pub const STALL: &str = "stall";
    pub const UNSTALL: &str = "unstall";
    pub const MODEL: &str = "model";
    pub const POISON: &str = "poison";
    pub const UNPOISON: &str = "unpoison";
    pub const RAS: &str = "ras";
    /// Every command, for help texts and checks.
    pub const ALL: [&str; 13] = [
        INFO,
        COUNTERS,
        TRACE,
        BUFFERS,
        FAULTS,
        FAULT_ADD,
        FAULT_CLEAR,
        STALL,
        UNSTALL,
        MODEL,
        POISON,
        UNPOISON,
        RAS,
    ];
}

/// Longest request line; a longer one ends its connection.
const MAX_LINE: usize = 64 * 1024;
/// Connections served at once (each has a thread); more are refused with a message.
const MAX_CLIENTS: usize = 8;
/// A client that sends nothing for this long is dropped.
const IDLE: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{0}")]
    Request(String),
    #[error("control socket: {0}")]
    Io(#[from] io::Error),
    #[error("the daemon answered something that is not JSON: {0}")]
    Reply(String),
}

fn bad(msg: impl Into<String>) -> ControlError {
    ControlError::Request(msg.into())
}

/// Serves `listener` on a thread of its own for the daemon's life.
pub fn serve(listener: UnixListener, device: Arc<Device>) -> io::Result<()> {
    let clients = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                if clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
                    clients.fetch_sub(1, Ordering::AcqRel);
                    let _ = writeln!(conn, "{}", json!({"error": "too many control clients"}));
                    continue;
                }
                let (device, clients) = (device.clone(), clients.clone());
                let spawned = std::thread::Builder::new()
                    .name("control-client".into())
                    .spawn(move || {
                        let _ = client(conn, &device);
                        clients.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    log::warn!("control: cannot start a client thread");
                }
            }
        })?;
    Ok(())
}

/// Waits until `conn` has something to read; false after IDLE. (poll, not a socket
/// timeout: the sandbox allows no setsockopt.)
fn readable(conn: &UnixStream) -> bool {
    use std::os::fd::AsFd;
    matches!(wait_readable([conn.as_fd()], Some(IDLE)), Ok([true]))
}

fn client(conn: UnixStream, device: &Device) -> io::Result<()> {
    let mut out = conn.try_clone()?;
    let mut reader = BufReader::new(conn).take(MAX_LINE as u64 + 1);
    let mut line = String::new();
    loop {
        line.clear();
        reader.set_limit(MAX_LINE as u64 + 1);
        if reader.get_ref().buffer().is_empty() && !readable(reader.get_ref().get_ref()) {
            return Ok(());
        }
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line.len() > MAX_LINE {
            writeln!(out, "{}", json!({"error": "request line too long"}))?;
            return Ok(());
        }
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(req) => handle(device, &req).unwrap_or_else(|e| json!({"error": e.to_string()})),
            Err(e) => json!({"error": format!("not a JSON request: {e}")}),
        };
        writeln!(out, "{reply}")?;
    }
}

fn field<'a>(req: &'a Value, name: &str) -> Option<&'a Value> {
    req.get(name).filter(|v| !v.is_null())
}

fn u64_field(req: &Value, name: &str) -> Result<Option<u64>, ControlError> {
    match field(req, name) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(format!("\"{name}\" must be a non-negative integer"))),
    }
}

fn need_u64(req: &Value, name: &str) -> Result<u64, ControlError> {
    u64_field(req, name)?.ok_or_else(|| bad(format!("\"{name}\" is missing")))
}

/// An opcode by name ("COPY") or number; "all" (or nothing) is None.
pub fn parse_opcode(v: Option<&Value>) -> Result<Option<u16>, ControlError> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("all") => Ok(None),
        Some(Value::String(s)) => protocol::opcode_by_name(s)
            .map(Some)
            .ok_or_else(|| bad(format!("unknown opcode {s}"))),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| bad("opcode number out of range")),
        Some(_) => Err(bad("\"opcode\" must be a name or a number")),
    }
}

fn opcode_json(op: u16) -> Value {
    match protocol::opcode_name(op) {
        Some(n) => json!(n),
        None => json!(op),
    }
}

fn ms(req: &Value, name: &str) -> Result<Option<Duration>, ControlError> {
    Ok(u64_field(req, name)?.map(Duration::from_millis))
}

/// A fault rule from a request: opcode, one of nth/every/percent, seed, action.
fn rule_spec(req: &Value) -> Result<RuleSpec, ControlError> {
    let opcode = parse_opcode(field(req, "opcode"))?;
    let triggers = [
        u64_field(req, "nth")?.map(Trigger::Nth),
        u64_field(req, "every")?.map(Trigger::Every),
        match field(req, "percent") {
            None => None,
            Some(v) => Some(Trigger::Percent(
                v.as_f64()
                    .ok_or_else(|| bad("\"percent\" must be a number"))?,
            )),
        },
    ];
    let mut given = triggers.into_iter().flatten();
    let trigger = given
        .next()
        .ok_or_else(|| bad("say when: \"nth\", \"every\" or \"percent\""))?;
    if given.next().is_some() {
        return Err(bad("only one of \"nth\", \"every\", \"percent\""));
    }
    let action = match field(req, "action").and_then(Value::as_str) {
        Some("fail") => {
            let name = field(req, "status")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("\"fail\" needs a \"status\" name"))?;
            let s = Status::ALL
                .iter()
                .find(|s| s.name().eq_ignore_ascii_case(name))
                .ok_or_else(|| bad(format!("unknown status {name}")))?;
            Action::Fail(*s)
        }
        Some("delay") => {
            let min = ms(req, "min_ms")?.or(ms(req, "ms")?);
            let max = ms(req, "max_ms")?.or(min);
            match (min, max) {
                (Some(min), Some(max)) => Action::Delay { min, max },
                (None, Some(max)) => Action::Delay {
                    min: Duration::ZERO,
                    max,
                },
                _ => return Err(bad("\"delay\" needs \"ms\" or \"min_ms\"/\"max_ms\"")),
            }
        }
        Some("hang") => Action::Hang,
        Some("late") => Action::Late {
            after: ms(req, "after_ms")?.ok_or_else(|| bad("\"late\" needs \"after_ms\""))?,
        },
        Some("corrupt-length") => Action::CorruptLength,
        Some("corrupt-status") => Action::CorruptStatus,
        Some("skip") => Action::Skip,
        Some(a) => return Err(bad(format!("unknown action {a}"))),
        None => return Err(bad("\"action\" is missing")),
    };
    Ok(RuleSpec {
        opcode,
        trigger,
        action,
        seed: u64_field(req, "seed")?.unwrap_or(1),
    })
}

fn action_json(a: &Action) -> Value {
    match a {
        Action::Fail(s) => json!({"action": "fail", "status": s.name()}),
        Action::Delay { min, max } => json!({"action": "delay",
            "min_ms": min.as_millis() as u64, "max_ms": max.as_millis() as u64}),
        Action::Hang => json!({"action": "hang"}),
        Action::Late { after } => json!({"action": "late", "after_ms": after.as_millis() as u64}),
        Action::CorruptLength => json!({"action": "corrupt-length"}),
        Action::CorruptStatus => json!({"action": "corrupt-status"}),
        Action::Skip => json!({"action": "skip"}),
    }
}

fn model_json(m: &Model) -> Value {
    json!({"enforce": m.enforce, "read_latency_ns": m.read_latency_ns,
        "write_latency_ns": m.write_latency_ns, "read_bandwidth_mbs": m.read_bandwidth_mbs,
        "write_bandwidth_mbs": m.write_bandwidth_mbs})
}

fn merge(mut base: Value, more: Value) -> Value {
    if let (Some(b), Value::Object(m)) = (base.as_object_mut(), more) {
        b.extend(m);
    }
    base
}

/// Answers one request.
pub fn handle(device: &Device, req: &Value) -> Result<Value, ControlError> {
    let name = req
        .get("cmd")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("a request is an object with a \"cmd\""))?;
    let faults = device.faults();
    let ok = |v: Value| Ok(merge(json!({"ok": true}), v));
    match name {
        cmd::INFO => {
            let cfg = device.config();
            let layout = device.layout();
            ok(json!({
                "version": format!("{}.{}", cfg.version_major, cfg.version_minor),
                "daemon": env!("CARGO_PKG_VERSION"),
                "pid": std::process::id(),
                "index": cfg.device_index,
                "attach": format!("{:?}", device.attach()).to_lowercase(),
                "features": cfg.features,
                "memory_size": cfg.devmem_size,
                "memory_gpa": layout.devmem_gpa,
                "peers": layout.peers.len(),
                "engines": cfg.num_dma_engines,
                "stalled": faults.stalled(),
                "trace": device.tracing(),
            }))
        }
        cmd::COUNTERS => {
            let m = device.metrics();
            let stats: Map<String, Value> = (0..protocol::STAT_COUNT)
                .map(|i| (protocol::stat_name(i).to_string(), json!(device.stat(i))))
                .collect();
            let opcodes: Vec<Value> = m
                .opcodes()
                .iter()
                .map(|o| {
                    json!({"opcode": opcode_json(o.opcode), "count": o.count,
                        "errors": o.errors, "mean_us": o.mean_us,
                        "histogram_us": o.histogram})
                })
                .collect();
            let status: Map<String, Value> = m
                .by_status()
                .into_iter()
                .map(|(n, c)| (n.to_string(), json!(c)))
                .collect();
            ok(
                json!({"device": stats, "opcodes": opcodes, "status": status,
                "executing": m.executing()}),
            )
        }
        cmd::TRACE => {
            let on = field(req, "on")
                .and_then(Value::as_bool)
                .ok_or_else(|| bad("\"on\" must be true or false"))?;
            device.set_tracing(on);
            ok(json!({"trace": on}))
        }
        cmd::BUFFERS => {
            let list: Vec<Value> = device
                .buffers()
                .into_iter()
                .map(|(b, uuid)| {
                    json!({"id": b.id, "offset": b.offset, "size": b.size,
                        "uuid": uuid.map(|u| u.iter().map(|x| format!("{x:02x}")).collect::<String>())})
                })
                .collect();
            ok(json!({"buffers": list}))
        }
        cmd::FAULT_ADD => {
            let id = faults
                .add(rule_spec(req)?)
                .map_err(|e| bad(e.to_string()))?;
            ok(json!({"id": id}))
        }
        cmd::FAULTS => {
            let rules: Vec<Value> = faults
                .rules()
                .iter()
                .map(|r| {
                    let when = match r.trigger {
                        Trigger::Nth(n) => json!({"nth": n}),
                        Trigger::Every(k) => json!({"every": k}),
                        Trigger::Percent(p) => json!({"percent": p}),
                    };
                    merge(
                        merge(
                            json!({"id": r.id, "opcode": r.opcode.map_or(json!("all"), opcode_json),
                                "seed": r.seed, "matched": r.matched, "fired": r.fired}),
                            when,
                        ),
                        action_json(&r.action),
                    )
                })
                .collect();
            let poison: Vec<Value> = faults
                .poisoned()
                .iter()
                .map(|(o, l)| json!({"offset": o, "len": l}))
                .collect();
            ok(json!({"rules": rules, "stalled": faults.stalled(),
                "model": model_json(&faults.model()), "poison": poison}))
        }
        cmd::FAULT_CLEAR => {
            let n = faults
                .clear(u64_field(req, "id")?)
                .map_err(|e| bad(e.to_string()))?;
            ok(json!({"cleared": n}))
        }
        cmd::STALL | cmd::UNSTALL => {
            faults.set_stalled(name == cmd::STALL);
            ok(json!({"stalled": name == cmd::STALL}))
        }
        cmd::MODEL => {
            let mut m = faults.model();
            if let Some(v) = field(req, "enforce") {
                m.enforce = v
                    .as_bool()
                    .ok_or_else(|| bad("\"enforce\" must be true or false"))?;
            }
            let set = |name: &str, slot: &mut u32| -> Result<(), ControlError> {
                if let Some(v) = u64_field(req, name)? {
                    *slot = u32::try_from(v).map_err(|_| bad(format!("\"{name}\" too large")))?;
                }
                Ok(())
            };
            set("read_latency_ns", &mut m.read_latency_ns)?;
            set("write_latency_ns", &mut m.write_latency_ns)?;
            set("read_bandwidth_mbs", &mut m.read_bandwidth_mbs)?;
            set("write_bandwidth_mbs", &mut m.write_bandwidth_mbs)?;
            faults.set_model(m);
            ok(json!({"model": model_json(&m)}))
        }
        cmd::POISON => {
            let (offset, len) = (need_u64(req, "offset")?, need_u64(req, "len")?);
            device.poison(offset, len).map_err(|e| bad(e.to_string()))?;
            ok(json!({"poisoned": {"offset": offset, "len": len}}))
        }
        cmd::UNPOISON => {
            let (offset, len) = (need_u64(req, "offset")?, need_u64(req, "len")?);
            let hit = device.unpoison(offset, len);
            ok(json!({"cleared": hit}))
        }
        cmd::RAS => {
            let bit = || -> Result<u32, ControlError> {
                u32::try_from(need_u64(req, "bit")?).map_err(|_| bad("\"bit\" too large"))
            };
            let error = match field(req, "class").and_then(Value::as_str) {
                None => None,
                Some("correctable") => Some(RasError::Correctable { bit: bit()? }),
                Some("uncorrectable") => {
                    let mut header = [0u32; 4];
                    if let Some(h) = field(req, "header") {
                        let words = h
                            .as_array()
                            .filter(|a| a.len() <= 4)
                            .ok_or_else(|| bad("\"header\" is a list of up to 4 numbers"))?;
                        for (slot, w) in header.iter_mut().zip(words) {
                            *slot = w
                                .as_u64()
                                .and_then(|v| u32::try_from(v).ok())
                                .ok_or_else(|| bad("a \"header\" word is not a 32-bit number"))?;
                        }
                    }
                    Some(RasError::Uncorrectable {
                        bit: bit()?,
                        header,
                    })
                }
                Some(c) => return Err(bad(format!("unknown class {c}"))),
            };
            let unmasked = match error {
                Some(e) => Some(
                    device
                        .raise_ras(e)
                        .map_err(|e| bad(e.to_string()))?
                        .unmasked,
                ),
                None => None,
            };
            let (ue, ce, ue_mask, ce_mask) = device.cxl().ras_state();
            ok(
                json!({"unmasked": unmasked, "ras": {"uncorrectable_status": ue,
                "correctable_status": ce, "uncorrectable_mask": ue_mask,
                "correctable_mask": ce_mask}}),
            )
        }
        other => Err(bad(format!(
            "unknown command {other} (the commands: {})",
            cmd::ALL.join(", ")
        ))),
    }
}

/// Sends one request and returns the daemon's reply (for `cxl-accel ctl`).
pub fn request(socket: &std::path::Path, req: &Value) -> Result<Value, ControlError> {
    let mut s = UnixStream::connect(socket).map_err(|e| {
        ControlError::Request(format!(
            "cannot reach the control socket {}: {e}",
            socket.display()
        ))
    })?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    writeln!(s, "{req}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|_| ControlError::Reply(line.trim().to_string()))
}
