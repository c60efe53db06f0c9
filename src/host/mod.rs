// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The host side the device model stands on: the daemon's own files and sockets,
//! recovery from SIGBUS when memory shrinks under us, and the seccomp sandbox. Nothing here knows the
//! device, the rings or a transport.

pub mod files;
pub mod listen;
pub mod poll;
pub mod sandbox;
pub mod sigbus;
