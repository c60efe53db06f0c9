// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `cxl-accel ctl`: the control channel's client. Builds one request from the command line,
//! prints the daemon's reply for people (or as JSON with `--json`), and exits 1 when the
//! daemon refused the request.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use serde_json::{json, Value};

use crate::control::{cmd, request, ControlError};

#[derive(Parser, Debug)]
#[command(
    name = "cxl-accel ctl",
    about = "Talk to a running cxl-accel daemon through its --control-socket"
)]
pub struct CtlArgs {
    /// The daemon's control socket (its --control-socket).
    #[arg(long, value_name = "PATH")]
    pub control_socket: PathBuf,
    /// Print the daemon's JSON reply as it is.
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Device identity, attach mode, memory, engines, stall and trace state.
    Info,
    /// Device counters, per-opcode counts, errors and latency histograms, answers by status.
    Counters,
    /// One log line per command in the daemon's log (opcode, size, status, latency).
    Trace {
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// Live buffers: id, offset, size, UUID when exported.
    Buffers,
    /// Fault rules: add, list, clear.
    #[command(subcommand)]
    Fault(FaultCommand),
    /// Stop the DMA engines (commands wait, then time out in the driver).
    Stall,
    /// Let the engines run again.
    Unstall,
    /// The engines' latency and bandwidth model.
    Model {
        /// Make the engines take as long as the model says (true) or run flat out (false).
        #[arg(long)]
        enforce: Option<bool>,
        #[arg(long)]
        read_latency_ns: Option<u32>,
        #[arg(long)]
        write_latency_ns: Option<u32>,
        #[arg(long)]
        read_bandwidth_mbs: Option<u32>,
        #[arg(long)]
        write_bandwidth_mbs: Option<u32>,
    },
    /// Poison OFFSET..OFFSET+LEN of device memory (a media error; the driver is told).
    Poison {
        #[arg(value_parser = parse_u64)]
        offset: u64,
        #[arg(value_parser = parse_u64)]
        len: u64,
    },
    /// Clear poison in OFFSET..OFFSET+LEN.
    Unpoison {
        #[arg(value_parser = parse_u64)]
        offset: u64,
        #[arg(value_parser = parse_u64)]
        len: u64,
    },
    /// The CXL RAS registers (--attach cxl); with an option, raise an error there first
    /// (signalled to the driver unless the driver masked it).
    Ras {
        /// Set this correctable error status bit (0-6).
        #[arg(long, group = "class", value_name = "BIT")]
        correctable: Option<u32>,
        /// Set this uncorrectable error status bit (0-11, 14-16).
        #[arg(long, group = "class", value_name = "BIT")]
        uncorrectable: Option<u32>,
        /// With --uncorrectable: the header log's first words (up to 4, comma-separated).
        #[arg(long, requires = "uncorrectable", value_delimiter = ',', value_parser = parse_u64)]
        header: Vec<u64>,
    },
    /// Send one JSON request as it is (see the README for the request format).
    Raw { request: String },
}

#[derive(Subcommand, Debug)]
pub enum FaultCommand {
    /// Add a rule: which commands, when, and what happens to them.
    Add {
        /// Opcode name (COPY, FILL, ...), number, or "all".
        #[arg(long, default_value = "all")]
        opcode: String,
        /// The Nth matching command, once.
        #[arg(long, group = "when")]
        nth: Option<u64>,
        /// Every Kth matching command.
        #[arg(long, group = "when")]
        every: Option<u64>,
        /// Each matching command with this probability (percent).
        #[arg(long, group = "when")]
        percent: Option<f64>,
        /// Seed of the rule's generator (percent, random delays).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Complete with this status without executing (e.g. BAD_GPA, INTERNAL).
        #[arg(long, group = "what", value_name = "STATUS")]
        fail: Option<String>,
        /// Delay the completion by MS (up to --max-ms: random, from the seed).
        #[arg(long, group = "what", value_name = "MS")]
        delay_ms: Option<u64>,
        #[arg(long, requires = "delay_ms", value_name = "MS")]
        max_ms: Option<u64>,
        /// Never complete (until the queue stops).
        #[arg(long, group = "what")]
        hang: bool,
        /// Complete after MS, typically once the driver gave up.
        #[arg(long, group = "what", value_name = "MS")]
        late_ms: Option<u64>,
        /// Answer with a used length shorter than a response.
        #[arg(long, group = "what")]
        corrupt_length: bool,
        /// Answer with a status the specification does not define.
        #[arg(long, group = "what")]
        corrupt_status: bool,
        /// Answer OK without executing (a device that claims work it did not do).
        #[arg(long, group = "what")]
        skip: bool,
    },
    /// Rules, the stall state, the model and poisoned ranges.
    List,
    /// Remove rule ID, or every rule.
    Clear { id: Option<u64> },
}

/// Why a command line makes no request.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("'{0}' is not a number")]
    NotANumber(String),
    #[error("not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error(
        "say what happens: --fail, --delay-ms, --hang, --late-ms, --corrupt-length, \
         --corrupt-status or --skip"
    )]
    NoAction,
}

fn parse_u64(s: &str) -> Result<u64, CtlError> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| CtlError::NotANumber(s.to_string()))
}

/// The JSON request a command line stands for.
pub fn request_of(command: &CtlCommand) -> Result<Value, CtlError> {
    Ok(match command {
        CtlCommand::Info => json!({"cmd": cmd::INFO}),
        CtlCommand::Counters => json!({"cmd": cmd::COUNTERS}),
        CtlCommand::Trace { state } => json!({"cmd": cmd::TRACE, "on": state == "on"}),
        CtlCommand::Buffers => json!({"cmd": cmd::BUFFERS}),
        CtlCommand::Stall => json!({"cmd": cmd::STALL}),
        CtlCommand::Unstall => json!({"cmd": cmd::UNSTALL}),
        CtlCommand::Model {
            enforce,
            read_latency_ns,
            write_latency_ns,
            read_bandwidth_mbs,
            write_bandwidth_mbs,
        } => json!({"cmd": cmd::MODEL, "enforce": enforce,
            "read_latency_ns": read_latency_ns, "write_latency_ns": write_latency_ns,
            "read_bandwidth_mbs": read_bandwidth_mbs, "write_bandwidth_mbs": write_bandwidth_mbs}),
        CtlCommand::Poison { offset, len } => {
            json!({"cmd": cmd::POISON, "offset": offset, "len": len})
        }
        CtlCommand::Unpoison { offset, len } => {
            json!({"cmd": cmd::UNPOISON, "offset": offset, "len": len})
        }
        CtlCommand::Ras {
            correctable,
            uncorrectable,
            header,
        } => match (correctable, uncorrectable) {
            (Some(bit), _) => json!({"cmd": cmd::RAS, "class": "correctable", "bit": bit}),
            (_, Some(bit)) => {
                json!({"cmd": cmd::RAS, "class": "uncorrectable", "bit": bit, "header": header})
            }
            _ => json!({"cmd": cmd::RAS}),
        },
        CtlCommand::Raw { request } => serde_json::from_str(request)?,
        CtlCommand::Fault(FaultCommand::List) => json!({"cmd": cmd::FAULTS}),
        CtlCommand::Fault(FaultCommand::Clear { id }) => json!({"cmd": cmd::FAULT_CLEAR, "id": id}),
        CtlCommand::Fault(FaultCommand::Add {
            opcode,
            nth,
            every,
            percent,
            seed,
            fail,
            delay_ms,
            max_ms,
            hang,
            late_ms,
            corrupt_length,
            corrupt_status,
            skip,
        }) => {
            let mut r = json!({"cmd": cmd::FAULT_ADD, "opcode": opcode, "seed": seed,
                "nth": nth, "every": every, "percent": percent});
            let what = if let Some(s) = fail {
                json!({"action": "fail", "status": s})
            } else if let Some(ms) = delay_ms {
                json!({"action": "delay", "min_ms": ms, "max_ms": max_ms.unwrap_or(*ms)})
            } else if *hang {
                json!({"action": "hang"})
            } else if let Some(ms) = late_ms {
                json!({"action": "late", "after_ms": ms})
            } else if *corrupt_length {
                json!({"action": "corrupt-length"})
            } else if *corrupt_status {
                json!({"action": "corrupt-status"})
            } else if *skip {
                json!({"action": "skip"})
            } else {
                return Err(CtlError::NoAction);
            };
            if let (Some(r), Value::Object(w)) = (r.as_object_mut(), what) {
                r.extend(w);
            }
            r
        }
    })
}

/// Human rendering: "key: value" lines, nested objects indented, lists one item a line.
fn render(v: &Value, indent: usize, out: &mut String) {
    let pad = "  ".repeat(indent);
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if k == "ok" {
                    continue;
                }
                match v {
                    Value::Object(_) | Value::Array(_) => {
                        out.push_str(&format!("{pad}{k}:\n"));
                        render(v, indent + 1, out);
                    }
                    _ => out.push_str(&format!("{pad}{k}: {}\n", scalar(v))),
                }
            }
        }
        Value::Array(a) if a.is_empty() => out.push_str(&format!("{pad}(none)\n")),
        Value::Array(a) => {
            for item in a {
                match item {
                    Value::Object(m) => {
                        let line: Vec<String> = m
                            .iter()
                            .map(|(k, v)| format!("{k}={}", scalar(v)))
                            .collect();
                        out.push_str(&format!("{pad}- {}\n", line.join(" ")));
                    }
                    _ => out.push_str(&format!("{pad}- {}\n", scalar(item))),
                }
            }
        }
        _ => out.push_str(&format!("{pad}{}\n", scalar(v))),
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(scalar).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// Runs `cxl-accel ctl ...` (argv without the program name's "ctl"); returns the exit code.
pub fn main(args: impl Iterator<Item = String>) -> i32 {
    let a = CtlArgs::parse_from(args);
    let req = match request_of(&a.command) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cxl-accel ctl: {e}");
            return 2;
        }
    };
    match request(&a.control_socket, &req) {
        Ok(reply) => {
            let refused = reply.get("error").is_some();
            if a.json {
                println!("{reply}");
            } else if let Some(e) = reply.get("error") {
                eprintln!("cxl-accel ctl: {}", scalar(e));
            } else {
                let mut out = String::new();
                render(&reply, 0, &mut out);
                print!("{}", if out.is_empty() { "ok\n".into() } else { out });
            }
            i32::from(refused)
        }
        Err(e @ ControlError::Request(_)) | Err(e @ ControlError::Io(_)) => {
            eprintln!("cxl-accel ctl: {e}");
            2
        }
        Err(e) => {
            eprintln!("cxl-accel ctl: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(args: &[&str]) -> Value {
        let mut v = vec!["ctl", "--control-socket", "s"];
        v.extend_from_slice(args);
        request_of(&CtlArgs::parse_from(v).command).unwrap()
    }

    #[test]
    fn command_lines_become_requests() {
        assert_eq!(req(&["info"]), json!({"cmd": cmd::INFO}));
        assert_eq!(
            req(&["trace", "on"]),
            json!({"cmd": cmd::TRACE, "on": true})
        );
        assert_eq!(
            req(&["poison", "0x2000", "4096"]),
            json!({"cmd": cmd::POISON, "offset": 0x2000, "len": 4096})
        );
        let r = req(&[
            "fault", "add", "--opcode", "COPY", "--nth", "3", "--fail", "BAD_GPA",
        ]);
        assert_eq!(r["cmd"], "fault-add");
        assert_eq!(r["nth"], 3);
        assert_eq!(r["action"], "fail");
        assert_eq!(r["status"], "BAD_GPA");
        let r = req(&[
            "fault",
            "add",
            "--every",
            "2",
            "--delay-ms",
            "5",
            "--max-ms",
            "9",
        ]);
        assert_eq!(
            (r["min_ms"].as_u64(), r["max_ms"].as_u64()),
            (Some(5), Some(9))
        );
        assert_eq!(
            req(&["ras", "--uncorrectable", "14", "--header", "0x10,2"]),
            json!({"cmd": cmd::RAS, "class": "uncorrectable", "bit": 14, "header": [16, 2]})
        );
        assert_eq!(
            req(&["ras", "--correctable", "3"]),
            json!({"cmd": cmd::RAS, "class": "correctable", "bit": 3})
        );
        assert_eq!(req(&["ras"]), json!({"cmd": cmd::RAS}));
        assert_eq!(
            req(&["fault", "clear"]),
            json!({"cmd": cmd::FAULT_CLEAR, "id": null})
        );
    }

    #[test]
    fn a_rule_needs_an_action_and_one_trigger() {
        let a = CtlArgs::parse_from(["ctl", "--control-socket", "s", "fault", "add", "--nth", "1"]);
        assert!(request_of(&a.command).is_err());
        assert!(CtlArgs::try_parse_from([
            "ctl",
            "--control-socket",
            "s",
            "fault",
            "add",
            "--nth",
            "1",
            "--every",
            "2",
            "--hang"
        ])
        .is_err());
    }
}
