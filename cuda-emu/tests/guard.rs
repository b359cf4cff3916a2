//! The emulation's guard has teeth: a kernel that reads an activation before
//! `tarfa_grid_enter` (where, on the GPU, programmatic dependent launch may still be running the
//! launch that writes it) dies of SIGSEGV. The whole-model test (`whole_model.rs`) runs every
//! engine kernel under the same guard, so none of them does.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

const CHILD: &str = "TARFA_EMU_GUARD_CHILD";

#[test]
fn a_kernel_reading_an_activation_before_it_enters_dies_of_sigsegv() {
    if std::env::var_os(CHILD).is_some() {
        // The child: this must not return.
        let out = tarfa_cuda_emu::read_an_activation_before_entering();
        println!("returned {out:?}");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new(exe)
        .args([
            "--exact",
            "a_kernel_reading_an_activation_before_it_enters_dies_of_sigsegv",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.signal(),
        Some(11),
        "the child should die of SIGSEGV; status {:?}, stdout {stdout}",
        out.status
    );
    assert!(!stdout.contains("returned"), "{stdout}");
}
