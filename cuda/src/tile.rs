//! The shared-memory ring of the tiled products ([`TileGeometry`]) and how a tiled launch's
//! rows are spread over blocks: geometry only — which thread copies which bytes, and when —
//! never an operation or its order, so never a bit.

use crate::CudaError;

/// Dynamic shared memory a block may take without opting in.
pub(crate) const SHARED_MAX: usize = 48 * 1024;

/// Threads of a tiled launch (`TARFA_TILE_THREADS` in `kernels/tiled.cu`).
pub(crate) const TILE_THREADS: u32 = 128;
/// Rows of a tiled launch's block at most (`TARFA_TILE_MAX_ROWS`).
pub(crate) const TILE_MAX_ROWS: usize = 32;

/// The shared-memory ring of the tiled launches (`TARFA_TILE_STAGES` stages of
/// `TARFA_TILE_STAGE_BYTES` weight bytes, `stages − 1` in flight), which the kernels are compiled
/// for. A measuring knob (`TARFA_CUDA_TILE=STAGES,STAGE_BYTES` on the GPU): it changes which
/// thread copies which bytes and when, never an operation or its order, so never a bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileGeometry {
    stages: u32,
    stage_bytes: u32,
}

impl Default for TileGeometry {
    fn default() -> TileGeometry {
        TileGeometry::DEFAULT
    }
}

impl TileGeometry {
    /// The kernels' own (`kernels/tiled.cu`'s defaults): four stages of 8 KiB.
    pub const DEFAULT: TileGeometry = TileGeometry {
        stages: 4,
        stage_bytes: 8192,
    };
    /// Stages at least (one landing while one is read) and at most.
    pub const STAGES: std::ops::RangeInclusive<u32> = 2..=16;
    /// Weight bytes of a stage are whole 16-byte pieces for each of the block's threads.
    pub const STAGE_BYTES_STEP: u32 = 16 * TILE_THREADS;
    /// Weight bytes of a stage at least (the least multiple of the step that holds 32 columns of
    /// x and of a block's 32 F32 rows: 32 · (4 + 32 · 4) = 4,224 bytes) and at most.
    pub const STAGE_BYTES: std::ops::RangeInclusive<u32> = 6144..=65536;

    /// `stages` of `stage_bytes`, if the kernels take them (see [`TileGeometry::STAGES`] and
    /// [`TileGeometry::STAGE_BYTES`]).
    pub fn new(stages: u32, stage_bytes: u32) -> Result<TileGeometry, CudaError> {
        match Self::refusal(stages, stage_bytes) {
            None => Ok(TileGeometry {
                stages,
                stage_bytes,
            }),
            Some(why) => Err(CudaError::BadTileGeometry {
                value: format!("{stages},{stage_bytes}"),
                why,
            }),
        }
    }

    /// Why the kernels cannot take `stages` of `stage_bytes`, if they cannot.
    fn refusal(stages: u32, stage_bytes: u32) -> Option<String> {
        let (lo, hi) = (Self::STAGES.start(), Self::STAGES.end());
        if !Self::STAGES.contains(&stages) {
            return Some(format!("{stages} stages is outside {lo}..={hi}"));
        }
        let (lo, hi, step) = (
            Self::STAGE_BYTES.start(),
            Self::STAGE_BYTES.end(),
            Self::STAGE_BYTES_STEP,
        );
        if !Self::STAGE_BYTES.contains(&stage_bytes) || stage_bytes % step != 0 {
            return Some(format!(
                "{stage_bytes} bytes a stage is not a multiple of {step} in {lo}..={hi}"
            ));
        }
        None
    }

    /// `STAGES,STAGE_BYTES` (decimal, e.g. `6,16384`) as `TARFA_CUDA_TILE` gives it; the error
    /// names the value and why it is refused.
    pub fn parse(text: &str) -> Result<TileGeometry, CudaError> {
        let bad = |why: String| CudaError::BadTileGeometry {
            value: text.to_string(),
            why,
        };
        let (stages, bytes) = text
            .split_once(',')
            .ok_or_else(|| bad("it is not two numbers STAGES,STAGE_BYTES".into()))?;
        let num = |v: &str| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| bad(format!("{:?} is not a number", v.trim())))
        };
        let (stages, stage_bytes) = (num(stages)?, num(bytes)?);
        match Self::refusal(stages, stage_bytes) {
            Some(why) => Err(bad(why)),
            None => Ok(TileGeometry {
                stages,
                stage_bytes,
            }),
        }
    }

    /// Itself if its dynamic shared memory ([`TileGeometry::shared`]) is within a block's
    /// `max_shared` bytes (the device's opt-in maximum).
    pub fn within(self, max_shared: u32) -> Result<TileGeometry, CudaError> {
        if self.shared() > max_shared {
            return Err(CudaError::BadTileGeometry {
                value: format!("{},{}", self.stages, self.stage_bytes),
                why: format!(
                    "the ring takes {} bytes of shared memory, above the device's {max_shared} a block",
                    self.shared()
                ),
            });
        }
        Ok(self)
    }

    /// Stages of the ring.
    pub const fn stages(self) -> u32 {
        self.stages
    }

    /// Weight bytes of a stage.
    pub const fn stage_bytes(self) -> u32 {
        self.stage_bytes
    }

    /// Dynamic shared bytes of a tiled launch (`TARFA_TILE_SHARED`): the rows' addresses, then
    /// the stages, each with 16 bytes of padding per row.
    pub const fn shared(self) -> u32 {
        let head = TILE_MAX_ROWS as u32 * 8;
        head + self.stages * (self.stage_bytes + TILE_MAX_ROWS as u32 * 16)
    }

    /// Whether a block's dynamic shared memory is above the 48 KiB it may take without opting in
    /// (the tiled kernels' `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`, set to
    /// [`TileGeometry::shared`]).
    pub fn needs_opt_in(self) -> bool {
        self.shared() as usize > SHARED_MAX
    }

    /// NVRTC's options compiling the kernels for this ring.
    pub fn defines(self) -> [String; 2] {
        [
            format!("-DTARFA_TILE_STAGES={}", self.stages),
            format!("-DTARFA_TILE_STAGE_BYTES={}", self.stage_bytes),
        ]
    }
}

/// Blocks per multiprocessor a tiled launch aims at (each keeps all but one of its ring's stages
/// in flight: three of 8 KiB by default). Measured on the H200 (12.7 GB model), each pair in one
/// session: 1 → 807.7 tokens/s against 773.6 at 2; 4 → 688.6 against 785.1 at 2 — more rows per
/// block (wider tiles of fewer blocks) beat more blocks.
const TILE_BLOCKS_PER_SM: usize = 1;

/// Rows (at most `max`, a power of two) per block of a tiled launch over `count` rows: the most
/// that still gives every multiprocessor its share of blocks. (Rows spread evenly over the
/// fewest rounds of a block per multiprocessor instead — q/k/v's 5,120 rows in 256 blocks of 20
/// rather than 160 of 32, of which 28 multiprocessors take two — was slower on the H200:
/// 899.4 / 918.1 tokens/s against 923.1 / 931.6, ledger row (bb).)
pub(crate) fn tile_rows(count: usize, max: usize, sms: usize) -> usize {
    let target = sms.max(1) * TILE_BLOCKS_PER_SM;
    let mut nr = max;
    while nr > 1 && count.div_ceil(nr) < target {
        nr /= 2;
    }
    nr
}

/// Dynamic shared memory a tiled product launch that takes its x (`cols` floats) in through an
/// RMSNorm needs beyond its ring: x, then the norm's scale in 16 bytes of its own
/// (`TARFA_TILE_NORM_SHARED`).
pub const fn tile_norm_shared(cols: usize) -> usize {
    4 * cols + 16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows per tiled block: a power of two within the kernel's limit (so it divides a hidden size
    /// of whole 32-element chunks: a down block's rows are of one slot), the most that still
    /// gives every multiprocessor a block, and one when the rows are fewer than the
    /// multiprocessors.
    #[test]
    fn tile_rows_are_a_power_of_two_giving_each_multiprocessor_a_block() {
        for sms in [1usize, 4, 132] {
            for count in [1usize, 7, 128, 2048, 5120, 6144, 16384, 151_936] {
                for max in [TILE_MAX_ROWS / 2, TILE_MAX_ROWS] {
                    let nr = tile_rows(count, max, sms);
                    assert!(
                        nr.is_power_of_two() && nr <= max,
                        "{count} {max} {sms}: {nr}"
                    );
                    assert_eq!(2048 % nr, 0);
                    let target = sms * TILE_BLOCKS_PER_SM;
                    if nr > 1 {
                        assert!(count.div_ceil(nr) >= target, "{count} {max} {sms}: {nr}");
                    }
                    if nr < max {
                        assert!(count.div_ceil(nr * 2) < target, "{count} {max} {sms}: {nr}");
                    }
                }
            }
        }
        assert_eq!(tile_rows(2048, TILE_MAX_ROWS, 132), 8); // o_proj of the 12.7 GB model
        assert_eq!(tile_rows(128, TILE_MAX_ROWS, 132), 1); // its router
    }

    /// The shared memory a tiled launch asks for is what `kernels/tiled.cu` lays out (rows'
    /// addresses, then the stages with their padding), and the default ring is the kernels' own
    /// (their `#ifndef` defaults), within the 48 KiB a block may take without opting in.
    #[test]
    fn tile_shared_bytes_match_the_kernels_layout() {
        let cu = crate::KERNELS_CU;
        let def = |name: &str| -> usize {
            let line = cu
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} not defined"));
            let value = line.split_whitespace().nth(2);
            value
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name}: {line}"))
        };
        assert_eq!(def("TARFA_TILE_THREADS"), TILE_THREADS as usize);
        assert_eq!(def("TARFA_TILE_MAX_ROWS"), TILE_MAX_ROWS);
        let tile = TileGeometry::DEFAULT;
        assert_eq!(def("TARFA_TILE_STAGES"), tile.stages() as usize);
        assert_eq!(def("TARFA_TILE_STAGE_BYTES"), tile.stage_bytes() as usize);
        for (stages, bytes) in [(4, 8192), (2, 6144), (6, 16384), (16, 65536)] {
            let g = TileGeometry::new(stages, bytes).expect("a ring the kernels take");
            let slot = bytes as usize + TILE_MAX_ROWS * 16;
            let want = TILE_MAX_ROWS * 8 + stages as usize * slot;
            assert_eq!(g.shared() as usize, want);
        }
        assert!(tile.shared() as usize <= SHARED_MAX);
        assert_eq!(
            tile.defines(),
            ["-DTARFA_TILE_STAGES=4", "-DTARFA_TILE_STAGE_BYTES=8192"]
        );
    }

    /// Every ring the checks take suits the kernel for every block it is given (1–32 rows, BF16 or
    /// F32), as `tarfa_tile_acc` works it out: a stage is whole 16-byte pieces for each thread,
    /// holds at least one 32-column chunk of x and of every row (the least stage taken is the
    /// least step that does: 4,096 bytes give 32 F32 rows no column), and x's columns with the
    /// padded rows fit a slot.
    #[test]
    fn every_ring_taken_holds_a_chunk_of_every_block() {
        let step = TileGeometry::STAGE_BYTES_STEP;
        let columns = |bytes: u32, n: u32, esz: u32| bytes / (4 + n * esz) / 32 * 32;
        for bytes in (step..=TileGeometry::STAGE_BYTES.end() + step).step_by(step as usize) {
            let taken = TileGeometry::new(2, bytes).is_ok();
            assert_eq!(taken, TileGeometry::STAGE_BYTES.contains(&bytes), "{bytes}");
            if !taken {
                continue;
            }
            let pieces = bytes / 16 / TILE_THREADS;
            assert_eq!(pieces * 16 * TILE_THREADS, bytes);
            for n in 1..=TILE_MAX_ROWS as u32 {
                for esz in [2, 4] {
                    let w = columns(bytes, n, esz);
                    assert!(w >= 32, "{bytes} bytes, {n} rows of {esz}");
                    assert!(w * (4 + n * esz) / 16 <= pieces * TILE_THREADS);
                    let used = w * 4 + n * (w * esz + 16);
                    assert!(used <= bytes + TILE_MAX_ROWS as u32 * 16);
                }
            }
        }
        assert_eq!(columns(4096, 32, 4), 0);
        assert!(!TileGeometry::STAGE_BYTES.contains(&4096));
        for stages in 0..=20 {
            let taken = TileGeometry::new(stages, 8192).is_ok();
            assert_eq!(taken, TileGeometry::STAGES.contains(&stages), "{stages}");
        }
    }

    /// `TARFA_CUDA_TILE`'s value: `STAGES,STAGE_BYTES`; anything else, or a ring the kernels or
    /// the device cannot take, is `BadTileGeometry` naming the value and why (never a panic).
    #[test]
    fn a_tile_geometry_is_two_numbers_the_kernels_and_the_device_take() {
        let g = TileGeometry::parse("6,16384").expect("6,16384");
        assert_eq!((g.stages(), g.stage_bytes()), (6, 16384));
        assert_eq!(
            TileGeometry::parse(" 4 , 8192 ").ok(),
            Some(TileGeometry::DEFAULT)
        );
        for (text, why) in [
            ("", "two numbers"),
            ("6", "two numbers"),
            ("6;16384", "two numbers"),
            ("6,16384,1", "\"16384,1\" is not a number"),
            ("six,16384", "\"six\" is not a number"),
            ("-2,8192", "\"-2\" is not a number"),
            ("1,8192", "1 stages is outside 2..=16"),
            ("17,8192", "17 stages is outside 2..=16"),
            (
                "4,4096",
                "4096 bytes a stage is not a multiple of 2048 in 6144..=65536",
            ),
            ("4,10000", "10000 bytes"),
            ("4,67584", "67584 bytes"),
            ("4,99999999999", "not a number"),
        ] {
            match TileGeometry::parse(text) {
                Err(e @ CudaError::BadTileGeometry { .. }) => {
                    let msg = e.to_string();
                    assert!(
                        msg.starts_with(&format!("TARFA_CUDA_TILE={text}: ")),
                        "{msg}"
                    );
                    assert!(msg.contains(why), "{text}: {msg}");
                    assert!(msg.contains("e.g. 6,16384, or unset for 4,8192"), "{msg}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(!TileGeometry::DEFAULT.needs_opt_in() && g.needs_opt_in());
        // The H200's opt-in maximum: 227 KiB a block.
        let h200 = 232_448;
        assert_eq!(g.within(h200).ok(), Some(g));
        assert_eq!(g.shared(), 101_632);
        let big = TileGeometry::new(16, 16384).expect("16,16384");
        match big.within(h200) {
            Err(e @ CudaError::BadTileGeometry { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("TARFA_CUDA_TILE=16,16384: the ring takes 270592 bytes of shared memory, above the device's 232448"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
        let top = TileGeometry::new(8, 26624).expect("8,26624");
        assert!(top.shared() <= h200 && top.within(h200).is_ok());
    }
}
