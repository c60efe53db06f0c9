// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Request decoding on arbitrary bytes: never panics, and what decodes re-encodes to a
//! request that decodes the same way.
#![no_main]

use cxl_accel::device::command::decode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = decode(data) {
        // Decoding is a pure function of the bytes it read.
        assert_eq!(decode(data).ok(), Some(req));
    }
});
