// tarfa's CUDA kernels compiled once more, for another ring of the tiled kernels than the
// default: build.rs compiles this file once per ring it lists, with -DTARFA_TILE_STAGES=… and
// -DTARFA_TILE_STAGE_BYTES=…, and with each kernel's name given the ring as a suffix (-D), so
// that this copy's kernels do not clash with launch.cc's; their other functions are private to
// it (an unnamed namespace). Only the tiled kernels' entry points (tiled.h) are used, through
// launch.cc's dispatch by ring.
#include "emu.h"
namespace {
#include "../../cuda/kernels/tarfa.cu"
}

#define G unsigned int grid, unsigned int block, unsigned int shared
#include "tiled.h"
