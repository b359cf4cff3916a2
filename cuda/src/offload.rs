//! The offload path's kernels on the GPU (`kernels/offload.cu`): routed experts' SwiGLU and
//! single products for a decoder whose other steps run on the CPU, with the CPU's bits (the
//! canonical reduction order on a warp, tarfa's own `exp`/SiLU).
//!
//! Every launch is bounds-checked on the host first: a matrix must lie inside its device buffer
//! and the activations must have the sizes the kernel reads.

#![allow(unsafe_code)]

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};

use crate::error::drv;
use crate::nvrtc::load_kernels;
use crate::tile::TileGeometry;
use crate::{CudaError, Gpu, GpuDtype};

/// A row-major `[rows, cols]` matrix at `offset` bytes into a [`DeviceBytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuMatrix {
    /// Byte offset in the buffer.
    pub offset: usize,
    /// Rows (outputs).
    pub rows: usize,
    /// Columns (inputs).
    pub cols: usize,
    /// Element type.
    pub dtype: GpuDtype,
}

impl GpuMatrix {
    fn bytes(&self) -> Option<usize> {
        self.dtype.row_bytes(self.cols)?.checked_mul(self.rows)
    }
}

/// Bytes in VRAM (an expert's weights).
#[derive(Debug)]
pub struct DeviceBytes {
    buf: CudaSlice<u8>,
}

impl DeviceBytes {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }
}

/// The compiled kernels on one GPU, and the stream they run on.
#[derive(Debug)]
pub struct GpuCompute {
    stream: Arc<CudaStream>,
    swiglu_gate: CudaFunction,
    matvec: CudaFunction,
    swiglu_gate_many: CudaFunction,
    matvec_many: CudaFunction,
    name: String,
}

/// One expert's share of a [`GpuCompute::swiglu_many`] call: its weights and its tokens.
#[derive(Debug)]
pub struct ExpertJob<'a> {
    /// The buffer holding gate, up and down.
    pub weights: &'a DeviceBytes,
    /// Gate `[inter, hidden]`.
    pub gate: GpuMatrix,
    /// Up `[inter, hidden]`.
    pub up: GpuMatrix,
    /// Down `[hidden, inter]`.
    pub down: GpuMatrix,
    /// The tokens routed to it.
    pub xs: &'a [&'a [f32]],
}

const BLOCK: u32 = 128;

/// The bytes of matrix `m` in `w` (checked by the caller to lie in it).
fn view<'a>(w: &'a DeviceBytes, m: &GpuMatrix) -> cudarc::driver::CudaView<'a, u8> {
    w.buf.slice(m.offset..m.offset + m.bytes().unwrap_or(0))
}

impl GpuCompute {
    /// Compile the kernels (NVRTC) and load them on `gpu` (the tiled ones, unused here, at the
    /// default ring).
    pub fn new(gpu: &Gpu) -> Result<GpuCompute, CudaError> {
        let module = load_kernels(gpu, TileGeometry::DEFAULT)?;
        let ctx = gpu.context().clone();
        Ok(GpuCompute {
            swiglu_gate: module
                .load_function("tarfa_swiglu_gate")
                .map_err(drv("kernel lookup"))?,
            matvec: module
                .load_function("tarfa_matvec")
                .map_err(drv("kernel lookup"))?,
            swiglu_gate_many: module
                .load_function("tarfa_swiglu_gate_many")
                .map_err(drv("kernel lookup"))?,
            matvec_many: module
                .load_function("tarfa_matvec_many")
                .map_err(drv("kernel lookup"))?,
            stream: ctx.new_stream().map_err(drv("stream creation"))?,
            name: gpu.name().to_string(),
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Free and total VRAM in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        self.stream
            .context()
            .mem_get_info()
            .map_err(drv("memory query"))
    }

    /// Copy `bytes` into a new VRAM buffer (synchronously).
    pub fn upload(&self, bytes: &[u8]) -> Result<DeviceBytes, CudaError> {
        let buf = self
            .stream
            .clone_htod(bytes)
            .map_err(drv("host-to-device copy"))?;
        self.stream.synchronize().map_err(drv("synchronize"))?;
        Ok(DeviceBytes { buf })
    }

    fn check(&self, w: &DeviceBytes, m: &GpuMatrix, what: &str) -> Result<(), CudaError> {
        // The offload kernels (`kernels/offload.cu`) read BF16 and F32 rows only.
        if !m.dtype.wide() {
            return Err(CudaError::Usage(format!(
                "{what} matrix of {}: the offload kernels take BF16 and F32",
                m.dtype.name()
            )));
        }
        let esz = m.dtype.block().1;
        if m.offset % esz != 0 {
            return Err(CudaError::Usage(format!(
                "{what} matrix at byte {} is not aligned to its {esz}-byte elements",
                m.offset
            )));
        }
        let end = m.bytes().and_then(|b| b.checked_add(m.offset));
        match end {
            Some(end)
                if end <= w.len()
                    && i32::try_from(m.rows).is_ok()
                    && i32::try_from(m.cols).is_ok() =>
            {
                Ok(())
            }
            _ => Err(CudaError::Usage(format!(
                "{what} matrix [{}, {}] at byte {} does not fit a {}-byte buffer",
                m.rows,
                m.cols,
                m.offset,
                w.len()
            ))),
        }
    }

    fn upload_xs(&self, xs: &[&[f32]], cols: usize) -> Result<CudaSlice<f32>, CudaError> {
        if let Some(x) = xs.iter().find(|x| x.len() != cols) {
            return Err(CudaError::Usage(format!(
                "an activation of {} elements for {cols} columns",
                x.len()
            )));
        }
        let flat: Vec<f32> = xs.concat();
        if flat.is_empty() {
            return self.stream.alloc_zeros::<f32>(1).map_err(drv("allocation"));
        }
        self.stream
            .clone_htod(&flat)
            .map_err(drv("host-to-device copy"))
    }

    fn grid(rows: usize, tokens: usize) -> Result<LaunchConfig, CudaError> {
        let warps = (rows as u64) * (tokens as u64);
        let blocks = warps.div_ceil(u64::from(BLOCK / 32)).max(1);
        let blocks = u32::try_from(blocks)
            .ok()
            .filter(|&b| b <= i32::MAX as u32)
            .ok_or_else(|| CudaError::Usage(format!("{warps} warps do not fit one launch")))?;
        Ok(LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        })
    }

    /// The SwiGLU of one expert for each token: `down(silu(gate x) ⊙ up x)`, every dot in the
    /// canonical order, `silu` as tarfa computes it: the bits of the CPU's
    /// `blocks::experts_swiglu` for the same weights and inputs. Each matrix lies in its buffer
    /// (the three may share one). With a `limit` (above 0) the gate and up dots are clamped
    /// first, as `kernels::MatJob::clamped` clamps them.
    pub fn swiglu(
        &self,
        gate: (&DeviceBytes, &GpuMatrix),
        up: (&DeviceBytes, &GpuMatrix),
        down: (&DeviceBytes, &GpuMatrix),
        xs: &[&[f32]],
        limit: Option<f32>,
    ) -> Result<Vec<Vec<f32>>, CudaError> {
        self.check(gate.0, gate.1, "gate")?;
        self.check(up.0, up.1, "up")?;
        self.check(down.0, down.1, "down")?;
        let (g, u, d) = (gate.1, up.1, down.1);
        let (inter, hidden) = (g.rows, g.cols);
        if u.rows != inter
            || u.cols != hidden
            || u.dtype != g.dtype
            || d.rows != hidden
            || d.cols != inter
        {
            return Err(CudaError::Usage(format!(
                "SwiGLU shapes gate [{inter}, {hidden}], up [{}, {}], down [{}, {}] do not fit",
                u.rows, u.cols, d.rows, d.cols
            )));
        }
        let t = xs.len();
        if t == 0 {
            return Ok(Vec::new());
        }
        if hidden == 0 || inter == 0 {
            // Nothing to compute on the device: the CPU's result (zeros, or no columns).
            return Ok(vec![vec![0.0; hidden]; t]);
        }
        let tokens = i32::try_from(t).map_err(|_| CudaError::Usage("too many tokens".into()))?;
        let x = self.upload_xs(xs, hidden)?;
        let mut h = self
            .stream
            .alloc_zeros::<f32>(inter * t)
            .map_err(drv("allocation"))?;
        let g_view = view(gate.0, g);
        let u_view = view(up.0, u);
        let (dt, rows, cols) = (g.dtype.code(), inter as i32, hidden as i32);
        let lim = limit.unwrap_or(0.0);
        // SAFETY: the kernel reads `rows × cols` elements of `dtype` from each weight view (checked
        // to lie in its buffer above), `tokens × cols` floats of `x` and writes `tokens × rows`
        // floats of `h`, both allocated with exactly those sizes; one warp per (row, token), and
        // warps past the end return.
        unsafe {
            self.stream
                .launch_builder(&self.swiglu_gate)
                .arg(&g_view)
                .arg(&u_view)
                .arg(&dt)
                .arg(&rows)
                .arg(&cols)
                .arg(&tokens)
                .arg(&lim)
                .arg(&x)
                .arg(&mut h)
                .launch(Self::grid(inter, t)?)
                .map_err(drv("kernel launch"))?;
        }
        let y = self.matvec_device(down.0, d, &h, t)?;
        let flat = self
            .stream
            .clone_dtoh(&y)
            .map_err(drv("device-to-host copy"))?;
        Ok(flat.chunks_exact(hidden).map(|r| r.to_vec()).collect())
    }

    /// Several experts of one shape (the routed experts of a layer) in two launches: each
    /// output the bits [`GpuCompute::swiglu`] gives that expert alone. Returns each job's
    /// outputs in job order. `limit` as [`GpuCompute::swiglu`]'s.
    pub fn swiglu_many(
        &self,
        jobs: &[ExpertJob<'_>],
        limit: Option<f32>,
    ) -> Result<Vec<Vec<Vec<f32>>>, CudaError> {
        let Some(first) = jobs.first() else {
            return Ok(Vec::new());
        };
        let (inter, hidden, dtype) = (first.gate.rows, first.gate.cols, first.gate.dtype);
        let mut tok_start = vec![0i32];
        for j in jobs {
            self.check(j.weights, &j.gate, "gate")?;
            self.check(j.weights, &j.up, "up")?;
            self.check(j.weights, &j.down, "down")?;
            let same = |m: &GpuMatrix, rows: usize, cols: usize, dt: GpuDtype| {
                m.rows == rows && m.cols == cols && m.dtype == dt
            };
            if !same(&j.gate, inter, hidden, dtype)
                || !same(&j.up, inter, hidden, dtype)
                || !same(&j.down, hidden, inter, j.down.dtype)
                || j.down.dtype != first.down.dtype
            {
                return Err(CudaError::Usage(
                    "swiglu_many: the experts of one call must share shapes and types".into(),
                ));
            }
            let n = i32::try_from(j.xs.len())
                .ok()
                .and_then(|n| tok_start.last().and_then(|&s| s.checked_add(n)))
                .ok_or_else(|| CudaError::Usage("too many tokens".into()))?;
            tok_start.push(n);
        }
        let total = *tok_start.last().unwrap_or(&0) as usize;
        if total == 0 {
            return Ok(jobs.iter().map(|_| Vec::new()).collect());
        }
        if hidden == 0 || inter == 0 {
            return Ok(jobs
                .iter()
                .map(|j| vec![vec![0.0; hidden]; j.xs.len()])
                .collect());
        }
        let n_exp = i32::try_from(jobs.len())
            .map_err(|_| CudaError::Usage("too many experts in one call".into()))?;
        let all: Vec<&[f32]> = jobs.iter().flat_map(|j| j.xs.iter().copied()).collect();
        let x = self.upload_xs(&all, hidden)?;
        // Each expert's matrix addresses; the borrows of their buffers (and the records that
        // order this stream after their writes) are held until the launches are queued.
        let mut records = Vec::with_capacity(jobs.len());
        let (mut gp, mut up, mut dp) = (Vec::new(), Vec::new(), Vec::new());
        for j in jobs {
            let (base, rec) = j.weights.buf.device_ptr(&self.stream);
            records.push(rec);
            gp.push(base + j.gate.offset as u64);
            up.push(base + j.up.offset as u64);
            dp.push(base + j.down.offset as u64);
        }
        let to_dev = |v: &[u64]| {
            self.stream
                .clone_htod(v)
                .map_err(drv("host-to-device copy"))
        };
        let (gp, up, dp) = (to_dev(&gp)?, to_dev(&up)?, to_dev(&dp)?);
        let starts = self
            .stream
            .clone_htod(&tok_start)
            .map_err(drv("host-to-device copy"))?;
        let mut h = self
            .stream
            .alloc_zeros::<f32>(inter * total)
            .map_err(drv("allocation"))?;
        let mut y = self
            .stream
            .alloc_zeros::<f32>(hidden * total)
            .map_err(drv("allocation"))?;
        let tot = total as i32;
        let (dt, rows, cols) = (dtype.code(), inter as i32, hidden as i32);
        let lim = limit.unwrap_or(0.0);
        // SAFETY: every address in `gp`/`up`/`dp` is a matrix checked above to lie in its
        // buffer, which the `jobs` borrow keeps alive past the synchronising copy below; row `t`
        // of `x` (`total × cols`, allocated so) belongs to the expert `e` with
        // `tok_start[e] <= t < tok_start[e + 1]` (`n_exp + 1` ascending entries from 0 to
        // `total`); `h` and `y` have exactly `total × rows` floats of each launch's output.
        unsafe {
            self.stream
                .launch_builder(&self.swiglu_gate_many)
                .arg(&gp)
                .arg(&up)
                .arg(&starts)
                .arg(&n_exp)
                .arg(&dt)
                .arg(&rows)
                .arg(&cols)
                .arg(&tot)
                .arg(&lim)
                .arg(&x)
                .arg(&mut h)
                .launch(Self::grid(inter, total)?)
                .map_err(drv("kernel launch"))?;
        }
        let (ddt, drows, dcols) = (first.down.dtype.code(), hidden as i32, inter as i32);
        // SAFETY: as above, for the down matrices (`hidden × inter`) reading `h`, writing `y`.
        unsafe {
            self.stream
                .launch_builder(&self.matvec_many)
                .arg(&dp)
                .arg(&starts)
                .arg(&n_exp)
                .arg(&ddt)
                .arg(&drows)
                .arg(&dcols)
                .arg(&tot)
                .arg(&h)
                .arg(&mut y)
                .launch(Self::grid(hidden, total)?)
                .map_err(drv("kernel launch"))?;
        }
        drop(records);
        let flat = self
            .stream
            .clone_dtoh(&y)
            .map_err(drv("device-to-host copy"))?;
        let mut rows_out = flat.chunks_exact(hidden).map(|r| r.to_vec());
        Ok(jobs
            .iter()
            .map(|j| rows_out.by_ref().take(j.xs.len()).collect())
            .collect())
    }

    /// `y_t = W x_t` for each token, every output one canonical dot: the bits of the CPU's
    /// `blocks::linear` (without bias).
    pub fn matmul(
        &self,
        w: &DeviceBytes,
        m: &GpuMatrix,
        xs: &[&[f32]],
    ) -> Result<Vec<Vec<f32>>, CudaError> {
        self.check(w, m, "matrix")?;
        let t = xs.len();
        if t == 0 {
            return Ok(Vec::new());
        }
        if m.rows == 0 || m.cols == 0 {
            return Ok(vec![vec![0.0; m.rows]; t]);
        }
        let x = self.upload_xs(xs, m.cols)?;
        let y = self.matvec_device(w, m, &x, t)?;
        let flat = self
            .stream
            .clone_dtoh(&y)
            .map_err(drv("device-to-host copy"))?;
        if m.rows == 0 {
            return Ok(vec![Vec::new(); t]);
        }
        Ok(flat.chunks_exact(m.rows).map(|r| r.to_vec()).collect())
    }

    /// `W x_t` of device-resident inputs `x` (`t × cols`), left on the device.
    fn matvec_device(
        &self,
        w: &DeviceBytes,
        m: &GpuMatrix,
        x: &CudaSlice<f32>,
        t: usize,
    ) -> Result<CudaSlice<f32>, CudaError> {
        self.check(w, m, "matrix")?;
        if x.len() < m.cols * t {
            return Err(CudaError::Usage(format!(
                "{} activations for {t} tokens of {} columns",
                x.len(),
                m.cols
            )));
        }
        let tokens = i32::try_from(t).map_err(|_| CudaError::Usage("too many tokens".into()))?;
        let mut y = self
            .stream
            .alloc_zeros::<f32>((m.rows * t).max(1))
            .map_err(drv("allocation"))?;
        let w_view = view(w, m);
        let (dt, rows, cols) = (m.dtype.code(), m.rows as i32, m.cols as i32);
        // SAFETY: the kernel reads `rows × cols` elements of `dtype` from the weight view (checked
        // above to lie in the buffer), `tokens × cols` floats of `x` (checked above) and writes
        // `tokens × rows` floats of `y` (allocated so); warps past the end return.
        unsafe {
            self.stream
                .launch_builder(&self.matvec)
                .arg(&w_view)
                .arg(&dt)
                .arg(&rows)
                .arg(&cols)
                .arg(&tokens)
                .arg(x)
                .arg(&mut y)
                .launch(Self::grid(m.rows, t)?)
                .map_err(drv("kernel launch"))?;
        }
        Ok(y)
    }
}
