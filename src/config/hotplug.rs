//! The `memory-hotplug` section and the bodies of `PUT` and `PATCH
//! /hotplug/memory` (Firecracker's `MemoryHotplugConfig` and
//! `MemoryHotplugSizeUpdate`): the virtio-mem region's size, block size and
//! memslot size, set before the start, and the size the guest is asked to
//! plug, changed while it runs.
//!
//! The checks are Firecracker's, with its messages (block at least 2 MiB and
//! a power of two, slot at least 128 MiB and whole blocks, total at least
//! one slot and whole slots), plus teravm's bound on the region:
//! [`MAX_HOTPLUG_SIZE_MIB`].

use serde::{Deserialize, Serialize};

/// The smallest block, and the default (Firecracker's
/// `VIRTIO_MEM_DEFAULT_BLOCK_SIZE_MIB`).
pub const MIN_BLOCK_SIZE_MIB: u32 = 2;
/// The smallest memslot, and the default (Firecracker's
/// `VIRTIO_MEM_DEFAULT_SLOT_SIZE_MIB`).
pub const MIN_SLOT_SIZE_MIB: u32 = 128;
/// The largest hotplug region: 64 TiB, as large as guest RAM may be
/// ([`super::MAX_MEM_SIZE_MIB`]). The region lies above RAM, so RAM and
/// region together stay under 128 TiB (2^47) of guest physical address
/// space, which every x86-64 host with 4-level paging (48-bit physical
/// addresses) gives. Firecracker takes a larger region at `PUT` and fails
/// the `InstanceStart`; teravm refuses it at once.
pub const MAX_HOTPLUG_SIZE_MIB: u32 = 64 << 20;

/// Why a `memory-hotplug` section is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HotplugConfigError {
    /// `block_size_mib` below [`MIN_BLOCK_SIZE_MIB`].
    #[error("Block size must not be lower than {MIN_BLOCK_SIZE_MIB} MiB (block_size_mib is {0})")]
    BlockSizeTooSmall(u32),
    /// `block_size_mib` not a power of two.
    #[error("Block size must be a power of 2 (block_size_mib is {0})")]
    BlockSizeNotPowerOfTwo(u32),
    /// `slot_size_mib` below [`MIN_SLOT_SIZE_MIB`].
    #[error("Slot size must not be lower than {MIN_SLOT_SIZE_MIB} MiB (slot_size_mib is {0})")]
    SlotSizeTooSmall(u32),
    /// `slot_size_mib` not whole blocks.
    #[error("Slot size must be a multiple of block size ({block} MiB) (slot_size_mib is {slot})")]
    SlotSizeNotMultipleOfBlockSize {
        /// The slot size asked for.
        slot: u32,
        /// The block size.
        block: u32,
    },
    /// `total_size_mib` below one slot.
    #[error(
        "Total size must not be lower than slot size ({slot} MiB) (total_size_mib is {total})"
    )]
    TotalSizeTooSmall {
        /// The total asked for.
        total: u32,
        /// The slot size.
        slot: u32,
    },
    /// `total_size_mib` not whole slots.
    #[error("Total size must be a multiple of slot size ({slot} MiB) (total_size_mib is {total})")]
    TotalSizeNotMultipleOfSlotSize {
        /// The total asked for.
        total: u32,
        /// The slot size.
        slot: u32,
    },
    /// `total_size_mib` above [`MAX_HOTPLUG_SIZE_MIB`] (teravm's bound).
    #[error(
        "Total size must not be above {MAX_HOTPLUG_SIZE_MIB} MiB (64 TiB, teravm's bound: the \
         region lies above guest RAM in the guest physical address space) (total_size_mib is \
         {0})"
    )]
    TotalSizeTooLarge(u32),
}

fn default_block_size_mib() -> u32 {
    MIN_BLOCK_SIZE_MIB
}

fn default_slot_size_mib() -> u32 {
    MIN_SLOT_SIZE_MIB
}

/// The hotplug region (`memory-hotplug`, `PUT /hotplug/memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryHotplugConfig {
    /// The region's size in MiB: the most the guest can plug.
    pub total_size_mib: u32,
    /// The unit the guest plugs and unplugs, in MiB.
    #[serde(default = "default_block_size_mib")]
    pub block_size_mib: u32,
    /// The unit the host maps into KVM and out of it, in MiB.
    #[serde(default = "default_slot_size_mib")]
    pub slot_size_mib: u32,
}

impl MemoryHotplugConfig {
    /// Firecracker's checks in its order, then teravm's bound.
    pub fn validate(&self) -> Result<(), HotplugConfigError> {
        let (total, block, slot) = (self.total_size_mib, self.block_size_mib, self.slot_size_mib);
        if block < MIN_BLOCK_SIZE_MIB {
            return Err(HotplugConfigError::BlockSizeTooSmall(block));
        }
        if !block.is_power_of_two() {
            return Err(HotplugConfigError::BlockSizeNotPowerOfTwo(block));
        }
        if slot < MIN_SLOT_SIZE_MIB {
            return Err(HotplugConfigError::SlotSizeTooSmall(slot));
        }
        if slot % block != 0 {
            return Err(HotplugConfigError::SlotSizeNotMultipleOfBlockSize { slot, block });
        }
        if total < slot {
            return Err(HotplugConfigError::TotalSizeTooSmall { total, slot });
        }
        if total % slot != 0 {
            return Err(HotplugConfigError::TotalSizeNotMultipleOfSlotSize { total, slot });
        }
        if total > MAX_HOTPLUG_SIZE_MIB {
            return Err(HotplugConfigError::TotalSizeTooLarge(total));
        }
        Ok(())
    }
}

/// The body of `PATCH /hotplug/memory`: the size the guest is asked to
/// plug (checked against the region by the running devices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryHotplugSizeUpdate {
    /// MiB to plug, whole blocks, at most `total_size_mib`.
    pub requested_size_mib: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(total: u32, block: u32, slot: u32) -> MemoryHotplugConfig {
        MemoryHotplugConfig {
            total_size_mib: total,
            block_size_mib: block,
            slot_size_mib: slot,
        }
    }

    #[test]
    fn bodies_and_defaults() {
        let c: MemoryHotplugConfig = serde_json::from_str(r#"{"total_size_mib": 1024}"#).unwrap();
        assert_eq!(c, cfg(1024, 2, 128));
        c.validate().unwrap();
        let c: MemoryHotplugConfig = serde_json::from_str(
            r#"{"total_size_mib": 2048, "block_size_mib": 64, "slot_size_mib": 256}"#,
        )
        .unwrap();
        assert_eq!(c, cfg(2048, 64, 256));
        assert_eq!(
            serde_json::to_value(c).unwrap(),
            serde_json::json!({"total_size_mib": 2048, "block_size_mib": 64, "slot_size_mib": 256})
        );
        for bad in [
            "{}",
            r#"{"total_size_mib": "bar"}"#,
            r#"{"total_size_mib": -1}"#,
            r#"{"total_size_mib": 4294967296}"#,
            r#"{"total_size_mib": 1024, "x": 1}"#,
        ] {
            assert!(
                serde_json::from_str::<MemoryHotplugConfig>(bad).is_err(),
                "{bad}"
            );
        }
        let u: MemoryHotplugSizeUpdate =
            serde_json::from_str(r#"{"requested_size_mib": 256}"#).unwrap();
        assert_eq!(u.requested_size_mib, 256);
        for bad in ["{}", r#"{"requested_size_mib": 1, "amount_mib": 2}"#] {
            assert!(
                serde_json::from_str::<MemoryHotplugSizeUpdate>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn firecrackers_rules_in_order() {
        use HotplugConfigError::*;
        let cases = [
            (cfg(1024, 1, 128), BlockSizeTooSmall(1)),
            (cfg(1024, 0, 128), BlockSizeTooSmall(0)),
            (cfg(1024, 3, 128), BlockSizeNotPowerOfTwo(3)),
            (cfg(1024, 2, 64), SlotSizeTooSmall(64)),
            (
                cfg(1024, 128, 192),
                SlotSizeNotMultipleOfBlockSize {
                    slot: 192,
                    block: 128,
                },
            ),
            (
                cfg(0, 2, 128),
                TotalSizeTooSmall {
                    total: 0,
                    slot: 128,
                },
            ),
            (
                cfg(1000, 2, 128),
                TotalSizeNotMultipleOfSlotSize {
                    total: 1000,
                    slot: 128,
                },
            ),
            (
                cfg(u32::MAX - 127, 2, 128),
                TotalSizeTooLarge(u32::MAX - 127),
            ),
        ];
        for (c, want) in cases {
            assert_eq!(c.validate(), Err(want.clone()), "{c:?}");
        }
        assert!(BlockSizeNotPowerOfTwo(3)
            .to_string()
            .starts_with("Block size must be a power of 2"));
        assert!(SlotSizeTooSmall(64)
            .to_string()
            .starts_with("Slot size must not be lower than 128 MiB"));
        for ok in [
            cfg(128, 2, 128),
            cfg(128, 128, 128),
            cfg(MAX_HOTPLUG_SIZE_MIB, 2, 128),
            cfg(3 << 10, 1024, 1024),
        ] {
            ok.validate().unwrap();
        }
        assert_eq!(
            cfg(MAX_HOTPLUG_SIZE_MIB + 128, 2, 128).validate(),
            Err(TotalSizeTooLarge(MAX_HOTPLUG_SIZE_MIB + 128))
        );
    }
}
