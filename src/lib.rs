// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! cxl-accel: an emulated CXL Type-2 style accelerator for QEMU guests.
//!
//! Layout: [`protocol`] is the wire format; [`device`] (with [`devmem`], [`allocator`],
//! [`command`], [`engine`], [`dispatch`]) is the transport-independent device model;
//! [`backend`] adapts it to vhost-user; [`server`] runs the socket; [`cli`] is the command line.

pub mod allocator;
pub mod backend;
pub mod cli;
pub mod command;
pub mod crc32c;
pub mod device;
pub mod devmem;
pub mod dispatch;
pub mod engine;
pub mod files;
pub mod protocol;
pub mod sandbox;
pub mod server;
pub mod sigbus;
pub mod state;
pub mod supervisor;
pub mod workers;
