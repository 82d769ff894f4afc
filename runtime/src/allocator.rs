//! How the runtime's processes take memory from the kernel.
//!
//! A run's memory is short-lived and comes back in waves: a thousand runs
//! allocate their scopes, records and JSON, end, and free it all, and the
//! next thousand allocate it again. Each time freed memory went back to the
//! kernel, taking it again cost a page fault and the kernel zeroing the
//! page, and both allocators of a flow process did that on every wave:
//!
//! * mimalloc, the binaries' allocator, backs its arenas with transparent
//!   huge pages and purges what is freed after a few milliseconds, so that
//!   memory used again cost the zeroing of a fresh 2 MiB page: a quarter of
//!   B1's CPU in `clear_page_erms`. Without huge pages a page is zeroed only
//!   where it is touched (B1 × 10: 0.87 → 0.38 s of system time).
//! * glibc's `malloc`, which SQLite's C code uses, gave back every stretch
//!   over 128 KiB freed at the top of its heap. The journal writer's page
//!   cache grows past its size while a batch is dirty and shrinks after the
//!   commit, so the next batch faulted it in again: 88,000 page faults in
//!   B1 × 10, 3,000 once glibc keeps up to 16 MiB.
//!
//! docs/benchmarks.md ("Where B1's time goes") has the figures. This is the
//! one module of flow that may use `unsafe` (see the workspace lints):
//! `mallopt` has no safe interface.

#![allow(
    unsafe_code,
    reason = "mallopt(3): glibc's allocator parameters have no safe interface"
)]

/// Sets how this process takes memory (see the module's documentation);
/// the runtime's binaries call it first thing, and calling it again sets
/// the same values. Settings the system refuses leave the process as it
/// was, only slower.
pub fn configure_process() {
    // Huge pages already faulted in stay; those to come are not. The
    // setting passes to child processes (MCP servers, a browser), which run
    // as they would where THP is `madvise` or `never`. It is not what keeps
    // mimalloc's arena off huge pages: mimalloc advises them on its arena
    // before main, and on Linux 6.18 the prctl after that did not stop the
    // kernel granting them (flowc's 10,000-step check peaked at 26 MB
    // with it, 22.6 MB without the advice). The workspace builds mimalloc
    // with `no_thp`, which never advises them.
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets integer parameters that glibc's malloc reads
    // under its own locks, initializing the allocator first if need be;
    // every value is valid. It answers 0 for a parameter it refuses, which
    // only leaves glibc's default.
    unsafe {
        // Allocations up to 4 MiB from the heap, not each its own mapping
        // faulted in and unmapped again.
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 16 << 20);
    }
}
