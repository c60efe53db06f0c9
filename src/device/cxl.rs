// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The device as a CXL Type-2 endpoint: the registers of its CXL DVSECs and its component
//! register block (the RAS and HDM decoder capabilities), with the semantics the CXL
//! specification gives them and Linux's CXL core relies on: a decoder commits when told
//! to (or reports why not), a committed decoder with Lock On Commit ignores writes until
//! reset, RAS status bits clear when written with 1. Transport-independent: the vfio-user
//! function places the DVSECs in config space and the block in a BAR.
//!
//! At power-on nothing is committed, as on hardware before firmware runs; platform firmware
//! (here the guest driver's stand-in, which QEMU has none for) programs decoder 0 and the
//! DVSEC range at the address the platform's CXL window gives the device.
//!
//! Resets keep what the specification keeps (CXL r3.1 8.1.3, 8.2.4.17, 9.5-9.7):
//! - power-on ([`Cxl::power_on`]): everything back to its default;
//! - a conventional reset (hot or warm, [`Cxl::conventional_reset`]): the DVSEC and decoder
//!   state goes, the RAS registers stay (they are sticky);
//! - Function Level Reset: nothing here (FLR does not touch CXL.cache or CXL.mem state);
//! - CXL Reset (the DVSEC's Initiate CXL Reset): CXL.mem state goes, except what is locked
//!   (the locked decoder, and under CONFIG_LOCK the DVSEC fields it froze) and the sticky RAS
//!   registers; with Mem Clr enabled the caller clears device memory too.

use std::sync::{Arc, Mutex};

use crate::device::state::{Saved, StateFile};

/// The component register block, a BAR of its own (64 KiB).
pub const COMPONENT_BLOCK_SIZE: u64 = 0x1_0000;
/// The CXL.cache/CXL.mem registers inside the block.
const CM: u64 = 0x1000;
/// Capability structures, from `CM`.
const RAS_PTR: u64 = 0x080;
const HDM_PTR: u64 = 0x200;
/// RAS capability length (CXL r3.1 8.2.4.17).
const RAS_LEN: u64 = 0x58;
/// HDM decoders this device has (Linux takes one for a Type-2 region).
pub const DECODERS: usize = 1;
const HDM_LEN: u64 = 0x10 + 0x20 * DECODERS as u64;
/// HPA and DPA granularity of decoders and DVSEC ranges.
pub const GRANULE: u64 = 256 << 20;

/// Uncorrectable error bits a RAS status register has (CXL r3.1 8.2.4.17.1).
pub const UE_MASK: u32 = 0x1_CFFF;
/// Correctable error bits.
pub const CE_MASK: u32 = 0x7F;

// HDM decoder control bits (CXL r3.1 8.2.4.20.7).
const CTRL_LOCK: u32 = 1 << 8;
const CTRL_COMMIT: u32 = 1 << 9;
const CTRL_COMMITTED: u32 = 1 << 10;
const CTRL_ERR: u32 = 1 << 11;
/// Target type: 0 = device-coherent (HDM-D, "accelerator"), 1 = host-only.
const CTRL_HOSTONLY: u32 = 1 << 12;
/// Bits software may write: IG, IW, lock, commit, target type.
const CTRL_WRITABLE: u32 = 0xFF | CTRL_LOCK | CTRL_COMMIT | CTRL_HOSTONLY;

/// DVSEC CXL Device control: Mem_Enable.
pub const DVSEC_MEM_ENABLE: u16 = 1 << 2;
/// DVSEC CXL Device control: IO_Enable, hardwired to 1 (CXL.io is always on).
const DVSEC_IO_ENABLE: u16 = 1 << 1;
/// DVSEC CXL Lock: CONFIG_LOCK, set once until reset; it makes the RWL fields (Control's
/// enables, Range 1's base) read-only (CXL r3.1 8.1.3.6).
const DVSEC_CONFIG_LOCK: u16 = 1;
/// DVSEC CXL Capability: Cache, IO and Mem capable, one HDM range, Cache Writeback and
/// Invalidate capable, CXL Reset capable and Mem Clr capable; the CXL Reset timeout (bits
/// 10:8) comes from the memory size ([`reset_timeout`]).
const DVSEC_CAPABILITY: u16 = 0x17 | 1 << 6 | 1 << 7 | 1 << 11;
// DVSEC CXL Control2 (CXL r3.1 8.1.3.4) and Status2 (8.1.3.5).
const CONTROL2_DISABLE_CACHING: u16 = 1 << 0;
const CONTROL2_INITIATE_WBI: u16 = 1 << 1;
const CONTROL2_INITIATE_RESET: u16 = 1 << 2;
const CONTROL2_MEM_CLR: u16 = 1 << 3;
/// Control2 bits that hold their value (the two Initiate bits read as 0).
const CONTROL2_KEPT: u16 = CONTROL2_DISABLE_CACHING | CONTROL2_MEM_CLR;
const STATUS2_CACHE_INVALID: u16 = 1 << 0;
const STATUS2_RESET_COMPLETE: u16 = 1 << 1;
/// Power Management Initialization Complete: always, there is nothing to initialise.
const STATUS2_PM_INIT_COMPLETE: u16 = 1 << 15;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Decoder {
    base: u64,
    size: u64,
    ctrl: u32,
    skip: u64,
}

impl Decoder {
    fn locked(&self) -> bool {
        self.ctrl & (CTRL_LOCK | CTRL_COMMITTED) == CTRL_LOCK | CTRL_COMMITTED
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Ras {
    ue_status: u32,
    ue_mask: u32,
    ue_severity: u32,
    ce_status: u32,
    ce_mask: u32,
    /// First error pointer: the uncorrectable status bit logged first.
    first_error: u32,
    header_log: [u32; 16],
}

impl Default for Ras {
    fn default() -> Ras {
        Ras {
            ue_status: 0,
            ue_mask: UE_MASK,
            ue_severity: UE_MASK,
            ce_status: 0,
            ce_mask: CE_MASK,
            first_error: 0,
            header_log: [0; 16],
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Regs {
    hdm_global: u32,
    decoders: [Decoder; DECODERS],
    ras: Ras,
    dvsec_control: u16,
    dvsec_lock: u16,
    range_base: u64,
    control2: u16,
    status2: u16,
}

impl Regs {
    /// After a conventional reset: the defaults, but RAS is sticky.
    fn after_conventional_reset(&self) -> Regs {
        Regs {
            ras: self.ras.clone(),
            ..Regs::default()
        }
    }

    /// After a CXL Reset: the defaults, but RAS is sticky, a committed and locked decoder
    /// stays as it is (its global enable with it), and under CONFIG_LOCK the fields it
    /// locked (Control's enables, the range base) keep their values. Reset Complete is set.
    fn after_cxl_reset(&self) -> Regs {
        let mut r = self.after_conventional_reset();
        for (new, old) in r.decoders.iter_mut().zip(&self.decoders) {
            if old.locked() {
                *new = *old;
                r.hdm_global = self.hdm_global;
            }
        }
        if self.dvsec_lock & DVSEC_CONFIG_LOCK != 0 {
            r.dvsec_lock = self.dvsec_lock;
            r.dvsec_control = self.dvsec_control;
            r.range_base = self.range_base;
        }
        r.status2 = STATUS2_RESET_COMPLETE;
        r
    }
}

/// A CXL Reset the guest started through the CXL Device DVSEC: the transport resets the
/// function and, when asked, clears device memory before the guest sees Reset Complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CxlReset {
    pub clear_memory: bool,
}

/// A RAS error raised in the registers, for the control channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RasError {
    /// Correctable error status bit `bit` (0..=6).
    Correctable { bit: u32 },
    /// Uncorrectable error status bit `bit`, with the header log's first dwords.
    Uncorrectable { bit: u32, header: [u32; 4] },
}

/// What a raised RAS error did: whether it is unmasked, so the device signals it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raised {
    pub unmasked: bool,
}

/// Why a RAS error cannot be raised.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CxlError {
    #[error("no such {kind} error bit {bit}")]
    NoSuchBit { kind: &'static str, bit: u32 },
    #[error("the device has CXL registers only with --attach cxl")]
    NotCxl,
}

/// The layout of saved registers ([`Regs::to_words`]): bumped when it changes, so a
/// daemon never reads another's layout.
const SAVED_FORMAT: u64 = 1 | (DECODERS as u64) << 8;

impl Regs {
    /// The registers as words, for the state file.
    fn to_words(&self) -> Vec<u64> {
        let mut w = vec![SAVED_FORMAT, self.hdm_global as u64];
        for d in &self.decoders {
            w.extend([d.base, d.size, d.ctrl as u64, d.skip]);
        }
        let ras = &self.ras;
        w.extend(
            [
                ras.ue_status,
                ras.ue_mask,
                ras.ue_severity,
                ras.ce_status,
                ras.ce_mask,
                ras.first_error,
            ]
            .map(u64::from),
        );
        w.extend(ras.header_log.map(u64::from));
        w.extend([
            self.dvsec_control as u64,
            self.dvsec_lock as u64,
            self.range_base,
            self.control2 as u64,
            self.status2 as u64,
        ]);
        w
    }

    /// The inverse of [`Regs::to_words`]; None for another layout.
    fn from_words(w: &[u64]) -> Option<Regs> {
        let mut it = w.iter().copied();
        if it.next()? != SAVED_FORMAT {
            return None;
        }
        let mut next = || it.next();
        let mut r = Regs {
            hdm_global: next()? as u32,
            ..Regs::default()
        };
        for d in r.decoders.iter_mut() {
            *d = Decoder {
                base: next()?,
                size: next()?,
                ctrl: next()? as u32,
                skip: next()?,
            };
        }
        let ras = &mut r.ras;
        for f in [
            &mut ras.ue_status,
            &mut ras.ue_mask,
            &mut ras.ue_severity,
            &mut ras.ce_status,
            &mut ras.ce_mask,
            &mut ras.first_error,
        ] {
            *f = next()? as u32;
        }
        for h in ras.header_log.iter_mut() {
            *h = next()? as u32;
        }
        r.dvsec_control = next()? as u16;
        r.dvsec_lock = next()? as u16;
        r.range_base = next()?;
        r.control2 = next()? as u16;
        r.status2 = next()? as u16;
        next().is_none().then_some(r)
    }
}

/// The endpoint's CXL registers.
pub struct Cxl {
    /// Device memory the decoders may map: the device memory size, in whole granules.
    capacity: u64,
    regs: Mutex<Regs>,
    /// Where every change is saved, for a daemon that takes over (`--supervise`).
    store: Option<Arc<StateFile>>,
}

/// The registers locked for a change, saved when the change is done.
struct RegsMut<'a> {
    regs: std::sync::MutexGuard<'a, Regs>,
    store: Option<&'a StateFile>,
}

impl std::ops::Deref for RegsMut<'_> {
    type Target = Regs;
    fn deref(&self) -> &Regs {
        &self.regs
    }
}

impl std::ops::DerefMut for RegsMut<'_> {
    fn deref_mut(&mut self) -> &mut Regs {
        &mut self.regs
    }
}

impl Drop for RegsMut<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.store {
            s.save(Saved::Cxl, &self.regs.to_words());
        }
    }
}

impl Cxl {
    pub fn new(devmem_size: u64) -> Cxl {
        Cxl::with_store(devmem_size, None)
    }

    /// Registers whose every change is saved in `store`.
    pub fn with_store(devmem_size: u64, store: Option<Arc<StateFile>>) -> Cxl {
        Cxl {
            capacity: devmem_size / GRANULE * GRANULE,
            regs: Mutex::new(Regs::default()),
            store,
        }
    }

    /// Takes over the registers a previous daemon saved; false (power-on state kept) when
    /// there are none it can read.
    pub fn resume_saved(&self) -> bool {
        let saved = self.store.as_ref().and_then(|s| s.saved(Saved::Cxl));
        match saved.as_deref().and_then(Regs::from_words) {
            Some(r) => {
                *self.regs_mut() = r;
                true
            }
            None => false,
        }
    }

    /// What decoder 0 and the DVSEC range can map: device memory in whole 256 MiB.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn regs(&self) -> std::sync::MutexGuard<'_, Regs> {
        self.regs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The registers, to change them.
    fn regs_mut(&self) -> RegsMut<'_> {
        RegsMut {
            regs: self.regs(),
            store: self.store.as_deref(),
        }
    }

    /// Power-on state: nothing committed, HDM and memory disabled, no error logged.
    pub fn power_on(&self) {
        *self.regs_mut() = Regs::default();
    }

    /// A conventional (hot or warm) reset: as power-on, but the sticky RAS registers keep
    /// their status, masks and log.
    pub fn conventional_reset(&self) {
        let mut r = self.regs_mut();
        *r = r.after_conventional_reset();
    }

    /// Whether decoder 0 is committed, and its HPA range.
    pub fn committed_range(&self) -> Option<(u64, u64)> {
        let r = self.regs();
        let d = r.decoders[0];
        (d.ctrl & CTRL_COMMITTED != 0).then_some((d.base, d.size))
    }

    // ------------------------------------------------------------------ DVSECs

    /// The CXL Device DVSEC's registers from its capability field (offset 0x0A) on, as
    /// config space holds them; `off` counts from the DVSEC's start.
    pub fn dvsec_device_read(&self, off: u64) -> u32 {
        let r = self.regs();
        let size = self.capacity;
        match off & !3 {
            // Capability (a Type-2 device), after the DVSEC ID; Control, Status (nothing).
            0x08 => {
                let cap = DVSEC_CAPABILITY | reset_timeout(self.capacity) << 8;
                ((cap as u32) << 16) | DVSEC_DEVICE_ID as u32
            }
            0x0C => (r.dvsec_control | DVSEC_IO_ENABLE) as u32,
            0x10 => r.control2 as u32 | ((r.status2 | STATUS2_PM_INIT_COMPLETE) as u32) << 16,
            // CXL Lock; Capability2 (nothing) in the upper half.
            0x14 => r.dvsec_lock as u32,
            // Range 1: size with Memory_Info_Valid and Memory_Active, base as firmware set.
            0x18 => (size >> 32) as u32,
            0x1C => (size as u32 & 0xF000_0000) | 0x3,
            0x20 => (r.range_base >> 32) as u32,
            0x24 => r.range_base as u32 & 0xF000_0000,
            _ => 0,
        }
    }

    /// A config write into the CXL Device DVSEC (dword `off` from its start): Control's
    /// enables and Range 1's base are writable until CONFIG_LOCK is set, which is set
    /// once; Control2 starts a cache write-back or a CXL Reset, which the register state
    /// has gone through on return: what the caller must still do for it is returned.
    /// The rest is read-only.
    pub fn dvsec_device_write(&self, off: u64, value: u32, mask: u32) -> Option<CxlReset> {
        let mut r = self.regs_mut();
        let dw = off & !3;
        if dw == 0x14 {
            r.dvsec_lock |= (value & mask) as u16 & DVSEC_CONFIG_LOCK;
            return None;
        }
        if dw == 0x10 {
            // Status2 (the upper half) is read-only.
            return control2_write(&mut r, value as u16, mask as u16);
        }
        if r.dvsec_lock & DVSEC_CONFIG_LOCK != 0 {
            return None;
        }
        match dw {
            0x0C => {
                let v = (r.dvsec_control as u32 & !mask) | (value & mask);
                r.dvsec_control = (v as u16 & (0x7 & !DVSEC_IO_ENABLE)) | DVSEC_IO_ENABLE;
            }
            0x20 => {
                let hi = ((r.range_base >> 32) as u32 & !mask) | (value & mask);
                r.range_base = (r.range_base & 0xFFFF_FFFF) | (hi as u64) << 32;
            }
            0x24 => {
                let lo = (r.range_base as u32 & !mask) | (value & mask);
                r.range_base = (r.range_base & !0xFFFF_FFFF) | (lo & 0xF000_0000) as u64;
            }
            _ => {}
        }
        None
    }

    // ------------------------------------------------------ component registers

    /// A 32-bit read of the component register block at `off` (4-byte aligned).
    pub fn component_read(&self, off: u64) -> u32 {
        let r = self.regs();
        if !(CM..CM + 0x1000).contains(&off) {
            return 0;
        }
        let cm = off - CM;
        match cm {
            // CXL capability header: ID 1, version 1, cache/mem version 1, 2 entries.
            0x0 => 0x0211_0001,
            // RAS: ID 2, version 3; HDM decoder: ID 5, version 3.
            0x4 => 0x0003_0002 | ((RAS_PTR as u32) << 20),
            0x8 => 0x0003_0005 | ((HDM_PTR as u32) << 20),
            _ if (RAS_PTR..RAS_PTR + RAS_LEN).contains(&cm) => ras_read(&r.ras, cm - RAS_PTR),
            _ if (HDM_PTR..HDM_PTR + HDM_LEN).contains(&cm) => hdm_read(&r, cm - HDM_PTR),
            _ => 0,
        }
    }

    /// A 32-bit write of the component register block at `off` (4-byte aligned).
    pub fn component_write(&self, off: u64, value: u32) {
        let mut r = self.regs_mut();
        if !(CM..CM + 0x1000).contains(&off) {
            return;
        }
        let cm = off - CM;
        if (RAS_PTR..RAS_PTR + RAS_LEN).contains(&cm) {
            ras_write(&mut r.ras, cm - RAS_PTR, value);
        } else if (HDM_PTR..HDM_PTR + HDM_LEN).contains(&cm) {
            let capacity = self.capacity;
            hdm_write(&mut r, cm - HDM_PTR, value, capacity);
        }
    }

    // ---------------------------------------------------------------------- RAS

    /// Raises a RAS error: its status bit is set (the header log filled when it is the
    /// first uncorrectable one), as the device's error detection would. Whether the
    /// error is unmasked tells the transport to signal it.
    pub fn raise(&self, e: RasError) -> Result<Raised, CxlError> {
        let mut r = self.regs_mut();
        match e {
            RasError::Correctable { bit } => {
                if bit > 31 || (1 << bit) & CE_MASK == 0 {
                    return Err(CxlError::NoSuchBit {
                        kind: "correctable",
                        bit,
                    });
                }
                r.ras.ce_status |= 1 << bit;
                Ok(Raised {
                    unmasked: r.ras.ce_mask & (1 << bit) == 0,
                })
            }
            RasError::Uncorrectable { bit, header } => {
                if bit > 31 || (1 << bit) & UE_MASK == 0 {
                    return Err(CxlError::NoSuchBit {
                        kind: "uncorrectable",
                        bit,
                    });
                }
                if r.ras.ue_status == 0 {
                    r.ras.first_error = bit;
                    r.ras.header_log = [0; 16];
                    r.ras.header_log[..4].copy_from_slice(&header);
                }
                r.ras.ue_status |= 1 << bit;
                Ok(Raised {
                    unmasked: r.ras.ue_mask & (1 << bit) == 0,
                })
            }
        }
    }

    /// The RAS status registers (uncorrectable, correctable) and masks, for the control
    /// channel.
    pub fn ras_state(&self) -> (u32, u32, u32, u32) {
        let r = self.regs();
        (
            r.ras.ue_status,
            r.ras.ce_status,
            r.ras.ue_mask,
            r.ras.ce_mask,
        )
    }
}

/// DVSEC ID of the PCIe DVSEC for CXL Devices.
pub const DVSEC_DEVICE_ID: u16 = 0;

/// The CXL Reset timeout code (CXL r3.1 8.1.3.1: 001b 100 ms, 010b 1 s, 011b 10 s, 100b
/// 100 s) for clearing `capacity` bytes, which a CXL Reset with Mem Clr does before it
/// completes: at the 0.4 GB/s seen for 256 MiB on a busy 2-core host, with room.
fn reset_timeout(capacity: u64) -> u16 {
    match capacity {
        c if c <= 16 << 20 => 1,
        c if c <= 256 << 20 => 2,
        c if c <= 2 << 30 => 3,
        _ => 4,
    }
}

/// A write of DVSEC CXL Control2. The device has no cache of its own to write back (device
/// memory is the shared file), so a write-back and invalidation completes at once, and a
/// CXL Reset completes before the write returns.
fn control2_write(r: &mut Regs, value: u16, mask: u16) -> Option<CxlReset> {
    let written = value & mask;
    r.control2 = (r.control2 & !(mask & CONTROL2_KEPT)) | (written & CONTROL2_KEPT);
    let caching_off = r.control2 & CONTROL2_DISABLE_CACHING != 0;
    if !caching_off {
        // Cache Invalid reads 0 while caching is enabled.
        r.status2 &= !STATUS2_CACHE_INVALID;
    } else if written & CONTROL2_INITIATE_WBI != 0 {
        r.status2 |= STATUS2_CACHE_INVALID;
    }
    if written & CONTROL2_INITIATE_RESET == 0 {
        return None;
    }
    let clear_memory = r.control2 & CONTROL2_MEM_CLR != 0;
    *r = r.after_cxl_reset();
    Some(CxlReset { clear_memory })
}

fn ras_read(ras: &Ras, off: u64) -> u32 {
    match off {
        0x00 => ras.ue_status,
        0x04 => ras.ue_mask,
        0x08 => ras.ue_severity,
        0x0C => ras.ce_status,
        0x10 => ras.ce_mask,
        // First error pointer, multiple header recording capable.
        0x14 => ras.first_error | (1 << 9),
        0x18..=0x54 => ras.header_log[((off - 0x18) / 4) as usize],
        _ => 0,
    }
}

fn ras_write(ras: &mut Ras, off: u64, value: u32) {
    match off {
        // Status: write 1 to clear.
        0x00 => {
            ras.ue_status &= !(value & UE_MASK);
            if ras.ue_status == 0 {
                ras.header_log = [0; 16];
                ras.first_error = 0;
            }
        }
        0x04 => ras.ue_mask = value & UE_MASK,
        0x08 => ras.ue_severity = value & UE_MASK,
        0x0C => ras.ce_status &= !(value & CE_MASK),
        0x10 => ras.ce_mask = value & CE_MASK,
        _ => {}
    }
}

fn hdm_read(r: &Regs, off: u64) -> u32 {
    match off {
        // One decoder (count encoding 0), no targets (a device), A11:8 interleave capable.
        0x00 => 1 << 8,
        0x04 => r.hdm_global,
        _ => {
            let n = ((off - 0x10) / 0x20) as usize;
            let d = &r.decoders[n];
            match (off - 0x10) % 0x20 {
                0x00 => d.base as u32 & 0xF000_0000,
                0x04 => (d.base >> 32) as u32,
                0x08 => d.size as u32 & 0xF000_0000,
                0x0C => (d.size >> 32) as u32,
                0x10 => d.ctrl,
                0x14 => d.skip as u32 & 0xF000_0000,
                0x18 => (d.skip >> 32) as u32,
                _ => 0,
            }
        }
    }
}

fn hdm_write(r: &mut Regs, off: u64, value: u32, capacity: u64) {
    if off == 0x04 {
        r.hdm_global = value & 0x3;
        return;
    }
    if off < 0x10 {
        return;
    }
    let n = ((off - 0x10) / 0x20) as usize;
    let d = &mut r.decoders[n];
    if d.locked() {
        // Committed with Lock On Commit: fixed until reset.
        return;
    }
    let lo = |v: u64, w: u32| (v & !0xFFFF_FFFF) | (w & 0xF000_0000) as u64;
    let hi = |v: u64, w: u32| (v & 0xFFFF_FFFF) | (w as u64) << 32;
    match (off - 0x10) % 0x20 {
        0x00 => d.base = lo(d.base, value),
        0x04 => d.base = hi(d.base, value),
        0x08 => d.size = lo(d.size, value),
        0x0C => d.size = hi(d.size, value),
        0x10 => {
            let was = d.ctrl & CTRL_COMMIT != 0;
            let ctrl = value & CTRL_WRITABLE;
            let commit = ctrl & CTRL_COMMIT != 0;
            d.ctrl = ctrl | (d.ctrl & (CTRL_COMMITTED | CTRL_ERR));
            if commit && !was {
                // Commit: a decoder that maps no memory, more than the device has, or
                // interleaves (one device, one way) reports an error instead.
                let ways_ok = (ctrl >> 4) & 0xF == 0;
                let fits = d.size != 0 && d.skip + d.size <= capacity;
                if ways_ok && fits && d.base.is_multiple_of(GRANULE) {
                    d.ctrl = (d.ctrl | CTRL_COMMITTED) & !CTRL_ERR;
                } else {
                    d.ctrl = (d.ctrl | CTRL_ERR) & !CTRL_COMMITTED;
                }
            } else if !commit {
                d.ctrl &= !(CTRL_COMMITTED | CTRL_ERR);
            }
        }
        0x14 => d.skip = lo(d.skip, value),
        0x18 => d.skip = hi(d.skip, value),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_register_change_is_saved_and_a_successor_takes_it_over() {
        let store = Arc::new(StateFile::anonymous(256 << 20).unwrap());
        let c = Cxl::with_store(256 << 20, Some(store.clone()));
        c.component_write(CM + HDM_PTR + 0x10, 0x1000_0000);
        c.dvsec_device_write(0x0C, 0x4, 0xFFFF);
        c.raise(RasError::Uncorrectable {
            bit: 0,
            header: [1, 2, 3, 4],
        })
        .unwrap();
        let next = Cxl::with_store(256 << 20, Some(store.clone()));
        assert!(next.resume_saved());
        assert_eq!(*next.regs(), *c.regs());
        assert_eq!(next.ras_state(), c.ras_state());
        // Another layout is not read.
        let mut words = c.regs().to_words();
        words[0] += 1;
        assert!(Regs::from_words(&words).is_none());
        words[0] -= 1;
        words.pop();
        assert!(Regs::from_words(&words).is_none());
        // Without a store nothing is saved or taken over.
        assert!(!Cxl::new(256 << 20).resume_saved());
    }

    const HDM: u64 = CM + HDM_PTR;
    const D0: u64 = HDM + 0x10;
    const RAS: u64 = CM + RAS_PTR;

    fn program(c: &Cxl, base: u64, size: u64, ctrl: u32) {
        c.component_write(D0, base as u32);
        c.component_write(D0 + 4, (base >> 32) as u32);
        c.component_write(D0 + 8, size as u32);
        c.component_write(D0 + 0xC, (size >> 32) as u32);
        c.component_write(D0 + 0x10, ctrl);
    }

    #[test]
    fn the_capability_array_names_ras_and_hdm_where_they_are() {
        let c = Cxl::new(256 << 20);
        assert_eq!(c.component_read(CM) & 0xFFFF, 1);
        assert_eq!(c.component_read(CM) >> 24, 2);
        let ras = c.component_read(CM + 4);
        let hdm = c.component_read(CM + 8);
        assert_eq!((ras & 0xFFFF, (ras >> 20) as u64), (2, RAS_PTR));
        assert_eq!((hdm & 0xFFFF, (hdm >> 20) as u64), (5, HDM_PTR));
        // The CXL.io part of the block reads zeros.
        assert_eq!(c.component_read(0), 0);
    }

    #[test]
    fn a_decoder_commits_locks_and_ignores_writes_until_reset() {
        let c = Cxl::new(256 << 20);
        let base = 0x1_1000_0000;
        program(&c, base, 256 << 20, CTRL_LOCK | CTRL_COMMIT);
        let ctrl = c.component_read(D0 + 0x10);
        assert_ne!(ctrl & CTRL_COMMITTED, 0, "{ctrl:#x}");
        assert_eq!(ctrl & CTRL_ERR, 0);
        assert_eq!(c.committed_range(), Some((base, 256 << 20)));
        // Locked: neither an uncommit nor a new base takes.
        c.component_write(D0 + 0x10, 0);
        c.component_write(D0, 0x2000_0000);
        assert_ne!(c.component_read(D0 + 0x10) & CTRL_COMMITTED, 0);
        assert_eq!(c.component_read(D0), base as u32);
        c.conventional_reset();
        assert_eq!(c.committed_range(), None);
    }

    #[test]
    fn an_unlocked_decoder_uncommits_and_a_bad_one_reports_an_error() {
        let c = Cxl::new(256 << 20);
        program(&c, 0x1_1000_0000, 256 << 20, CTRL_COMMIT);
        assert!(c.committed_range().is_some());
        c.component_write(D0 + 0x10, 0);
        assert_eq!(c.committed_range(), None);
        // More than the device has.
        program(&c, 0x1_1000_0000, 512 << 20, CTRL_COMMIT);
        let ctrl = c.component_read(D0 + 0x10);
        assert_eq!(ctrl & (CTRL_COMMITTED | CTRL_ERR), CTRL_ERR);
        // Two ways on one device.
        c.component_write(D0 + 0x10, 0);
        program(&c, 0x1_1000_0000, 256 << 20, CTRL_COMMIT | (1 << 4));
        assert_ne!(c.component_read(D0 + 0x10) & CTRL_ERR, 0);
    }

    #[test]
    fn ras_status_clears_when_written_with_ones_and_logs_the_first_error() {
        let c = Cxl::new(256 << 20);
        // Masked at reset, as the kernel finds them before it unmasks.
        assert_eq!(c.component_read(RAS + 4), UE_MASK);
        c.component_write(RAS + 4, 0);
        let header = [0xdead, 0xbeef, 1, 2];
        let raised = c.raise(RasError::Uncorrectable { bit: 3, header }).unwrap();
        assert!(raised.unmasked);
        c.raise(RasError::Uncorrectable {
            bit: 5,
            header: [9; 4],
        })
        .unwrap();
        assert_eq!(c.component_read(RAS), (1 << 3) | (1 << 5));
        assert_eq!(c.component_read(RAS + 0x14) & 0x3F, 3);
        assert_eq!(c.component_read(RAS + 0x18), 0xdead);
        c.component_write(RAS, 1 << 3);
        assert_eq!(c.component_read(RAS), 1 << 5);
        c.component_write(RAS, 1 << 5);
        assert_eq!(c.component_read(RAS + 0x18), 0);
        // Correctable, masked.
        let masked = c.raise(RasError::Correctable { bit: 2 }).unwrap();
        assert!(!masked.unmasked);
        assert_eq!(c.component_read(RAS + 0xC), 1 << 2);
        assert_eq!(
            c.raise(RasError::Correctable { bit: 9 }),
            Err(CxlError::NoSuchBit {
                kind: "correctable",
                bit: 9
            })
        );
    }

    #[test]
    fn the_dvsec_range_is_valid_and_its_base_writable() {
        let c = Cxl::new(512 << 20);
        assert_eq!(c.dvsec_device_read(0x1C) & 0x3, 0x3);
        assert_eq!(c.dvsec_device_read(0x1C) & 0xF000_0000, 0x2000_0000);
        c.dvsec_device_write(0x24, 0x1000_0000, !0);
        c.dvsec_device_write(0x20, 0x1, !0);
        assert_eq!(c.dvsec_device_read(0x24), 0x1000_0000);
        assert_eq!(c.dvsec_device_read(0x20), 1);
        c.dvsec_device_write(0x0C, DVSEC_MEM_ENABLE as u32, 0xFFFF);
        assert_eq!(
            c.dvsec_device_read(0x0C) as u16,
            DVSEC_MEM_ENABLE | DVSEC_IO_ENABLE
        );
    }

    #[test]
    fn config_lock_freezes_the_enables_and_the_range_base_until_reset() {
        let c = Cxl::new(256 << 20);
        // IO_Enable reads 1 whatever is written.
        c.dvsec_device_write(0x0C, 0, 0xFFFF);
        assert_eq!(c.dvsec_device_read(0x0C) as u16, DVSEC_IO_ENABLE);
        c.dvsec_device_write(0x24, 0x1000_0000, !0);
        c.dvsec_device_write(0x14, DVSEC_CONFIG_LOCK as u32, 0xFFFF);
        assert_eq!(c.dvsec_device_read(0x14), DVSEC_CONFIG_LOCK as u32);
        c.dvsec_device_write(0x0C, DVSEC_MEM_ENABLE as u32, 0xFFFF);
        c.dvsec_device_write(0x24, 0x2000_0000, !0);
        c.dvsec_device_write(0x14, 0, 0xFFFF);
        assert_eq!(c.dvsec_device_read(0x0C) as u16, DVSEC_IO_ENABLE);
        assert_eq!(c.dvsec_device_read(0x24), 0x1000_0000);
        assert_eq!(c.dvsec_device_read(0x14), DVSEC_CONFIG_LOCK as u32);
        c.conventional_reset();
        assert_eq!(c.dvsec_device_read(0x14), 0);
        c.dvsec_device_write(0x24, 0x2000_0000, !0);
        assert_eq!(c.dvsec_device_read(0x24), 0x2000_0000);
    }

    /// Decoder 0 committed and locked at `base`, RAS with an error and masks written, the
    /// range base set, CONFIG_LOCK set with Mem_Enable on.
    fn set_up_locked(c: &Cxl, base: u64) {
        program(c, base, 256 << 20, CTRL_LOCK | CTRL_COMMIT);
        c.component_write(RAS + 4, 0);
        c.raise(RasError::Correctable { bit: 1 }).unwrap();
        c.dvsec_device_write(0x24, base as u32, !0);
        c.dvsec_device_write(0x0C, DVSEC_MEM_ENABLE as u32, 0xFFFF);
        c.dvsec_device_write(0x14, DVSEC_CONFIG_LOCK as u32, 0xFFFF);
    }

    #[test]
    fn the_dvsec_advertises_cxl_reset_with_mem_clr() {
        let c = Cxl::new(256 << 20);
        let cap = (c.dvsec_device_read(0x08) >> 16) as u16;
        assert_eq!(cap & 0x7, 0x7, "cache, IO and mem capable: {cap:#x}");
        assert_eq!((cap >> 4) & 0x3, 1, "one HDM range");
        assert_ne!(cap & (1 << 7), 0, "CXL Reset capable");
        assert_eq!((cap >> 8) & 0x7, 2, "256 MiB: CXL Reset timeout 1 s");
        let cap = (Cxl::new(1 << 30).dvsec_device_read(0x08) >> 16) as u16;
        assert_eq!((cap >> 8) & 0x7, 3, "1 GiB: CXL Reset timeout 10 s");
        assert_ne!(cap & (1 << 11), 0, "Mem Clr capable");
        // Status2: PM initialisation complete, nothing else.
        assert_eq!(c.dvsec_device_read(0x10) >> 16, 1 << 15);
    }

    #[test]
    fn a_conventional_reset_keeps_the_sticky_ras_registers_only() {
        let c = Cxl::new(256 << 20);
        set_up_locked(&c, 0x1_1000_0000);
        c.conventional_reset();
        assert_eq!(c.committed_range(), None);
        assert_eq!(c.dvsec_device_read(0x14), 0);
        assert_eq!(c.dvsec_device_read(0x24), 0);
        assert_eq!(c.dvsec_device_read(0x0C) as u16, DVSEC_IO_ENABLE);
        assert_eq!(c.component_read(RAS + 0xC), 1 << 1, "CE status is sticky");
        assert_eq!(c.component_read(RAS + 4), 0, "UE mask is sticky");
        c.power_on();
        assert_eq!(c.component_read(RAS + 0xC), 0);
        assert_eq!(c.component_read(RAS + 4), UE_MASK);
    }

    #[test]
    fn a_cxl_reset_keeps_what_is_locked_and_reports_completion() {
        let c = Cxl::new(256 << 20);
        let base = 0x1_1000_0000;
        set_up_locked(&c, base);
        // Mem Clr enabled in the same write as the Initiate bit.
        let reset = c.dvsec_device_write(0x10, (1 << 2) | (1 << 3), 0xFFFF);
        assert_eq!(reset, Some(CxlReset { clear_memory: true }));
        assert_eq!(c.committed_range(), Some((base, 256 << 20)));
        assert_eq!(c.dvsec_device_read(0x14), DVSEC_CONFIG_LOCK as u32);
        assert_eq!(c.dvsec_device_read(0x24), base as u32 & 0xF000_0000);
        assert_eq!(
            c.dvsec_device_read(0x0C) as u16,
            DVSEC_MEM_ENABLE | DVSEC_IO_ENABLE
        );
        assert_eq!(c.component_read(RAS + 0xC), 1 << 1);
        let ctl2 = c.dvsec_device_read(0x10);
        assert_eq!(ctl2 & 0xFFFF, 0, "the Initiate and Mem Clr bits reset");
        assert_eq!(ctl2 >> 16, (1 << 15) | (1 << 1), "Reset Complete");

        // Nothing locked: everything but RAS goes, and no memory clear unless asked.
        let c = Cxl::new(256 << 20);
        program(&c, base, 256 << 20, CTRL_COMMIT);
        c.dvsec_device_write(0x24, 0x1000_0000, !0);
        let reset = c.dvsec_device_write(0x10, 1 << 2, 0xFFFF);
        assert_eq!(
            reset,
            Some(CxlReset {
                clear_memory: false
            })
        );
        assert_eq!(c.committed_range(), None);
        assert_eq!(c.dvsec_device_read(0x24), 0);
    }

    #[test]
    fn a_write_back_and_invalidate_reports_cache_invalid_while_caching_is_off() {
        let c = Cxl::new(256 << 20);
        // Caching on: the write-back does not make the cache invalid.
        assert_eq!(c.dvsec_device_write(0x10, 1 << 1, 0xFFFF), None);
        assert_eq!(c.dvsec_device_read(0x10) & (1 << 16), 0);
        c.dvsec_device_write(0x10, 1, 0xFFFF);
        c.dvsec_device_write(0x10, 1 | (1 << 1), 0xFFFF);
        assert_eq!(c.dvsec_device_read(0x10) & 0x1_FFFF, 0x1_0001);
        // Status2 is read-only; caching on again clears Cache Invalid.
        c.dvsec_device_write(0x10, 0, 0xFFFF_0000);
        assert_ne!(c.dvsec_device_read(0x10) & (1 << 16), 0);
        c.dvsec_device_write(0x10, 0, 0xFFFF);
        assert_eq!(c.dvsec_device_read(0x10) & 0x1_FFFF, 0);
    }
}
