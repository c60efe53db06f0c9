// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! cxl-accel: an emulated CXL Type-2 style accelerator for QEMU guests.
//!
//! Module map:
//! - wire format: [`protocol`].
//! - device model, transport-independent: [`device`] (with [`devmem`], [`allocator`],
//!   [`command`], [`engine`], [`dispatch`]), injected faults ([`faults`]) and per-opcode
//!   [`metrics`], and the crash-safe [`state`] file (counters and the allocator's log).
//! - ring layer, no vhost-user type: [`ring`] turns descriptor chains into requests and
//!   answers into used entries, with its journal ([`ring::journal`]); the backend and the
//!   `chain` fuzz target both use it. [`resume`] takes rings over after a crash.
//!   [`stages`] times a request's way through the daemon, stage by stage.
//! - vhost-user transport: [`backend`] (the adapter; its `queues` submodule runs the
//!   command and event queues on the vring thread and the engines), [`announcer`] (the
//!   backend-channel thread), [`server`] (the socket).
//! - control channel: [`control`] (the daemon's JSON-lines socket) and [`ctl`] (its client,
//!   `cxl-accel ctl`).
//! - host side: [`files`], [`sigbus`], [`sandbox`], [`supervisor`] and [`workers`]
//!   (`--supervise`), [`cli`] (the command line) and [`qemu_args`] (the QEMU arguments
//!   that attach the device, `--print-qemu-args`).
//!
//! Each module has its own error enum; `main.rs` prints any of them as one line.

pub mod cli;
pub mod control;
pub mod device;
pub mod host;
pub mod protocol;
pub mod qemu_args;
pub mod ring;
pub mod supervisor;
pub mod vfio;
pub mod vhost;
