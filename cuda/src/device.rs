//! The resident decoder on the GPU: [`crate::Engine`] over [`CudaDevice`] — the
//! kernels of `kernels/` compiled by NVRTC (`nvrtc::load_kernels`), launched by
//! `cuLaunchKernelEx` on one stream, each step captured once as a CUDA graph and replayed (re-captured when
//! the KV cache grows), which removes the host's launch cost per kernel.
//!
//! On sm_90 and later every launch asks for programmatic dependent launch (the
//! `PROGRAMMATIC_STREAM_SERIALIZATION` attribute, kept in the captured graphs as programmatic
//! edges): a kernel may start while the one before it runs, loading its weights, and waits in
//! `tarfa_grid_enter` for that launch's results (see the kernels). It changes no bit; setting
//! `TARFA_CUDA_PDL=0` turns it off, for measuring.
//!
//! The tiled products' shared-memory ring is compiled in: `TARFA_CUDA_TILE=STAGES,STAGE_BYTES`
//! (e.g. `6,16384`) chooses another than the default 4 × 8 KiB, for measuring (checked against the
//! kernels' rules and the device's opt-in shared memory; above 48 KiB the tiled kernels are
//! allowed it). It changes which thread copies which bytes and when, never a bit.
//!
//! Safety: the engine passes raw device addresses of buffers it owns (allocated here, living as
//! long as it) and the arguments each kernel's parameter list has; one stream orders every copy,
//! launch and replay; cudarc's cross-stream event tracking is off for the context (one stream,
//! and events cannot be recorded inside a graph capture).

#![allow(unsafe_code)]

use std::sync::Arc;

use cudarc::driver::{sys, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr};

use crate::error::drv;
use crate::nvrtc::load_kernels;
use crate::switches::{pdl_wanted, tile_wanted};
use crate::{Arg, CudaError, EngineDevice, Geometry, Gpu, Kernel, MatJobs, MoeArgs, TileGeometry};

/// One GPU's stream and the resident decoder's kernels on it.
#[derive(Debug)]
pub struct CudaDevice {
    stream: Arc<CudaStream>,
    funcs: Vec<(Kernel, CudaFunction)>,
    name: String,
    sms: usize,
    /// Launch with programmatic dependent launch (sm_90+, unless `TARFA_CUDA_PDL=0`).
    pdl: bool,
    /// The tiled kernels' ring (`TARFA_CUDA_TILE`, else the default).
    tile: TileGeometry,
    /// The dynamic shared memory the tiled kernels are allowed.
    tile_shared_max: u32,
}

/// A captured CUDA graph.
pub struct Graph(CudaGraph);

// SAFETY: a CUDA graph may be launched from any thread with its context bound (cudarc binds it
// in `launch`); the engine owns its graphs and replays them only through `&mut self`, so never
// from two threads at once, as the driver requires of graph objects.
unsafe impl Send for Graph {}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Graph")
    }
}

impl CudaDevice {
    /// Compile the kernels (the tiled ones for the ring `TARFA_CUDA_TILE` asks for, if any) and
    /// make a stream on `gpu`.
    pub fn open(gpu: &Gpu) -> Result<CudaDevice, CudaError> {
        let ctx = gpu.context().clone();
        let opt_in = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(drv("device attribute"))?;
        let env = std::env::var_os("TARFA_CUDA_TILE");
        let tile = tile_wanted(env.as_deref(), u32::try_from(opt_in).unwrap_or(0))?;
        let module = load_kernels(gpu, tile)?;
        // SAFETY: this context's buffers are used on this device's one stream only, ordered by
        // it; cudarc's cross-stream events are not needed (and cannot be recorded in a capture).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("stream creation"))?;
        let mut funcs = Vec::new();
        for k in Kernel::ALL {
            funcs.push((
                k,
                module
                    .load_function(k.name())
                    .map_err(drv("kernel lookup"))?,
            ));
        }
        // The tiled kernels may take all the shared memory a block can have: a ring above
        // 48 KiB, and a product that takes its x in through a norm keeps x there after the ring.
        // All of it may be dynamic: they have no static shared memory (nvrtc.rs's test
        // `a_ring_chosen_at_run_time_compiles_and_the_default_is_the_sources_own` holds them to it).
        let tile_shared_max = u32::try_from(opt_in).unwrap_or(0).max(48 * 1024);
        if tile_shared_max > 48 * 1024 {
            ctx.bind_to_thread().map_err(drv("kernel attribute"))?;
            for (k, f) in &funcs {
                if matches!(
                    k,
                    Kernel::TiledMatvec | Kernel::TiledGateUp | Kernel::TiledDown
                ) {
                    f.set_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        tile_shared_max as i32,
                    )
                    .map_err(drv("kernel attribute"))?;
                }
            }
        }
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("device attribute"))?;
        let major = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(drv("device attribute"))?;
        Ok(CudaDevice {
            stream,
            funcs,
            pdl: pdl_wanted(major, std::env::var("TARFA_CUDA_PDL").ok().as_deref()),
            tile,
            tile_shared_max,
            sms: usize::try_from(sms).unwrap_or(1).max(1),
            name: format!("{} (CUDA device {})", gpu.name(), gpu.ordinal()),
        })
    }
}

impl CudaDevice {
    /// `f` launched by `cuLaunchKernelEx` on the stream, with the programmatic stream
    /// serialization attribute when `self.pdl` (else none: a plain launch).
    ///
    /// # Safety
    /// As [`EngineDevice::launch`]: `args` are the kernel's parameters, every address and size
    /// in live buffers of this device.
    unsafe fn launch_ex(
        &self,
        f: &CudaFunction,
        geo: Geometry,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        // Each parameter's address, pointing into `args` (alive for the call; the driver copies
        // the values at launch, and into the graph's node when capturing). MatJobs and MoeArgs
        // are #[repr(C)] with the kernels' structs' layout field for field (u64 per pointer, i32
        // per int).
        let mut params: Vec<*mut std::ffi::c_void> = args
            .iter()
            .map(|a| match a {
                Arg::Ptr(p) => p as *const u64 as *mut std::ffi::c_void,
                Arg::I32(v) => v as *const i32 as *mut std::ffi::c_void,
                Arg::F32(v) => v as *const f32 as *mut std::ffi::c_void,
                Arg::Jobs(j) => j as *const MatJobs as *mut std::ffi::c_void,
                Arg::Moe(m) => m as *const MoeArgs as *mut std::ffi::c_void,
            })
            .collect();
        // SAFETY: a plain C union; zeroed is a valid value of each of its members.
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let cfg = sys::CUlaunchConfig {
            gridDimX: geo.grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: geo.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: geo.shared,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.pdl),
        };
        self.stream
            .context()
            .bind_to_thread()
            .map_err(drv("kernel launch"))?;
        // SAFETY: cfg, attr and params live across the call; the caller's contract covers the
        // kernel's parameters.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(drv("kernel launch"))
    }
}

impl EngineDevice for CudaDevice {
    type Buf = CudaSlice<u8>;
    type Graph = Graph;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn multiprocessors(&self) -> usize {
        self.sms
    }

    fn tile(&self) -> TileGeometry {
        self.tile
    }

    fn tile_shared_max(&self) -> u32 {
        self.tile_shared_max
    }

    fn alloc(&self, len: usize) -> Result<CudaSlice<u8>, CudaError> {
        self.stream
            .alloc_zeros::<u8>(len.max(1))
            .map_err(drv("allocation"))
    }

    fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, CudaError> {
        if bytes.is_empty() {
            return self.alloc(1);
        }
        self.stream
            .clone_htod(bytes)
            .map_err(drv("host-to-device copy"))
    }

    fn write(&self, buf: &mut CudaSlice<u8>, offset: usize, bytes: &[u8]) -> Result<(), CudaError> {
        let end = offset
            .checked_add(bytes.len())
            .filter(|&e| e <= buf.len())
            .ok_or_else(|| CudaError::Usage("a write past the end of a device buffer".into()))?;
        let mut dst = buf.slice_mut(offset..end);
        self.stream
            .memcpy_htod(bytes, &mut dst)
            .map_err(drv("host-to-device copy"))
    }

    fn read(&self, buf: &CudaSlice<u8>, len: usize) -> Result<Vec<u8>, CudaError> {
        if len > buf.len() {
            return Err(CudaError::Usage(
                "a read past the end of a device buffer".into(),
            ));
        }
        self.stream
            .clone_dtoh(&buf.slice(0..len))
            .map_err(drv("device-to-host copy"))
    }

    fn copy(
        &self,
        src: &CudaSlice<u8>,
        dst: &mut CudaSlice<u8>,
        len: usize,
    ) -> Result<(), CudaError> {
        if len > src.len() || len > dst.len() {
            return Err(CudaError::Usage(
                "a copy past the end of a device buffer".into(),
            ));
        }
        if len == 0 {
            return Ok(());
        }
        let mut d = dst.slice_mut(0..len);
        self.stream
            .memcpy_dtod(&src.slice(0..len), &mut d)
            .map_err(drv("device-to-device copy"))
    }

    fn addr(&self, buf: &CudaSlice<u8>) -> u64 {
        let (p, _record) = buf.device_ptr(&self.stream);
        p
    }

    fn sync(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(drv("synchronize"))
    }

    unsafe fn launch(&self, k: Kernel, geo: Geometry, args: &[Arg]) -> Result<(), CudaError> {
        let f = self
            .funcs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, f)| f)
            .ok_or_else(|| CudaError::Usage(format!("kernel {} not loaded", k.name())))?;
        // SAFETY: the caller's contract (arguments as the kernel's parameters, every address and
        // size in live buffers of this device).
        unsafe { self.launch_ex(f, geo, args) }
    }

    fn capture(
        &self,
        f: &mut dyn FnMut() -> Result<(), CudaError>,
    ) -> Result<Option<Graph>, CudaError> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("graph capture"))?;
        let launched = f();
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(drv("graph capture"));
        launched?;
        Ok(graph?.map(Graph))
    }

    fn replay(&self, g: &Graph) -> Result<(), CudaError> {
        g.0.launch().map_err(drv("graph launch"))
    }
}
