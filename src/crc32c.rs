// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! CRC-32C (Castagnoli), the CHECKSUM command's algorithm.

const POLY: u32 = 0x82f6_3b78;

const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Running CRC-32C: `Crc32c::new(seed)`, `update` any number of times, `finish`.
#[derive(Clone, Copy)]
pub struct Crc32c {
    state: u32,
    hw: bool,
}

impl Crc32c {
    pub fn new(seed: u32) -> Crc32c {
        Crc32c {
            state: !seed,
            hw: hw_available(),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if self.hw {
            // SAFETY: `hw` is true only when the CPU reports SSE4.2.
            self.state = unsafe { update_sse42(self.state, data) };
            return;
        }
        self.state = update_table(self.state, data);
    }

    pub fn finish(self) -> u32 {
        !self.state
    }
}

pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    let mut c = Crc32c::new(seed);
    c.update(data);
    c.finish()
}

fn hw_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("sse4.2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn update_table(mut state: u32, data: &[u8]) -> u32 {
    for &b in data {
        state = TABLE[((state ^ b as u32) & 0xff) as usize] ^ (state >> 8);
    }
    state
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn update_sse42(state: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut s = state as u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        s = _mm_crc32_u64(s, v);
    }
    let mut s = s as u32;
    for &b in words.remainder() {
        s = _mm_crc32_u8(s, b);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(crc32c(0, b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(0, b""), 0);
        assert_eq!(update_table(!0, b"123456789") ^ !0, 0xe306_9283);
    }

    #[test]
    fn incremental_equals_one_shot_and_hw_equals_table() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut c = Crc32c::new(5);
        for chunk in data.chunks(333) {
            c.update(chunk);
        }
        assert_eq!(c.finish(), crc32c(5, &data));
        assert_eq!(crc32c(5, &data), !update_table(!5, &data));
    }
}
