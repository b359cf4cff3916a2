//! The C layouts of the structures the kernels take by value (`TarfaMatJob`, `TarfaMatJobs`,
//! `TarfaMoe` in `kernels/matvec.cu` and `kernels/moe.cu`), field for field.

/// The C layout of `TarfaMatJob` in `kernels/matvec.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MatJob {
    /// Weights.
    pub w: u64,
    /// Input.
    pub x: u64,
    /// Output.
    pub y: u64,
    /// Bias, or 0.
    pub bias: u64,
    /// Rows.
    pub rows: i32,
    /// Columns.
    pub cols: i32,
    /// Weight element type.
    pub dtype: i32,
    /// Bias element type.
    pub bias_dtype: i32,
    /// Add to `y` instead of storing.
    pub accumulate: i32,
    /// Wide loads (`cols` a multiple of 8, buffers 16-byte aligned).
    pub vec: i32,
}

/// Products in one launch at most.
pub const MAX_JOBS: usize = 4;

/// The C layout of `TarfaMatJobs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MatJobs {
    /// The products.
    pub job: [MatJob; MAX_JOBS],
    /// Product `i`'s rows are quads `row_start[i]..row_start[i + 1]`.
    pub row_start: [i32; MAX_JOBS + 1],
    /// Products used.
    pub n: i32,
    /// When > 0: every product's `x` is `job[0].x` and `vec`, and its first `stage` floats (the
    /// widest product's columns) are staged in shared memory by each block.
    pub stage: i32,
}

/// The C layout of `TarfaMoe`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MoeArgs {
    /// Address of the gate address table.
    pub gate: u64,
    /// Address of the up address table.
    pub up: u64,
    /// Address of the down address table.
    pub down: u64,
    /// Experts in the tables.
    pub n_experts: i32,
    /// Expert width.
    pub inter: i32,
    /// Hidden size.
    pub hidden: i32,
    /// Gate element type.
    pub dtype_g: i32,
    /// Up element type (the tiled kernels only where it is the gate's).
    pub dtype_u: i32,
    /// Down element type.
    pub dtype_d: i32,
    /// Wide loads for gate/up (both BF16 or both F32, of one type).
    pub vec_gu: i32,
    /// Wide loads for down.
    pub vec_d: i32,
    /// Above 0: each SwiGLU's gate and up clamped first ([`crate::EngineShape::swiglu_limit`]);
    /// 0: as they are.
    pub limit: f32,
}
