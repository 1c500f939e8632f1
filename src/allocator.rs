//! The binary's allocator: mimalloc, asked the way that takes its fast path.
//!
//! `mimalloc::MiMalloc` hands every allocation to `mi_malloc_aligned`. In mimalloc 3
//! that call takes the plain fast path only for blocks up to 1 KiB whose page has a free
//! block at hand; anything larger (a body buffer, a header map's entries) goes through
//! its over-allocating path, about 170 instructions more each, ten times per proxied
//! request. mimalloc aligns every block to a word, and every block of 16 bytes or more
//! to 16 (`MI_MAX_ALIGN_SIZE`: sizes are rounded to two words on 64-bit targets), so a
//! layout asking for no more than that (and no more than its size) is served by
//! `mi_malloc` itself; only stricter alignments go to the aligned calls.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment mimalloc gives every block at least this large (`MI_MAX_ALIGN_SIZE`).
const MAX_ALIGN: usize = 16;

/// mimalloc as a [`GlobalAlloc`], with layouts its blocks already satisfy on its plain
/// calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct Allocator;

/// True when `mi_malloc(size)` already gives `align`: at most 16, and no more than the
/// size (a block of 8 bytes is only word aligned).
#[inline]
fn plain(align: usize, size: usize) -> bool {
    align <= MAX_ALIGN && align <= size
}

// SAFETY: every call forwards to mimalloc, which returns null or a block of at least
// `size` bytes aligned as asked: by `mi_*_aligned`, or by `mi_malloc`'s own alignment
// when `plain` holds. Blocks from either are freed and reallocated by the same heap.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocation calls accept any size and power-of-two alignment.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; the new block keeps its
        // alignment (mimalloc's own, or asked for explicitly).
        unsafe {
            if plain(layout.align(), new_size) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size class and alignment a program asks for comes back aligned, holds what
    /// is written, and survives growing and shrinking.
    #[test]
    fn blocks_are_aligned_as_asked_through_alloc_zeroed_and_realloc() {
        let sizes = (1..=64).chain((65..=5000).step_by(37)).chain([65_536, 1 << 20, 3 << 20]);
        for size in sizes {
            for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; each block is freed with the layout it has.
                unsafe {
                    let p = Allocator.alloc(layout);
                    assert!(!p.is_null() && p as usize % align == 0, "{size} {align}");
                    p.write_bytes(0xA5, size);
                    let q = Allocator.realloc(p, layout, size * 2 + 7);
                    assert!(!q.is_null() && q as usize % align == 0, "{size} {align} grown");
                    assert!((0..size).all(|i| *q.add(i) == 0xA5), "kept when grown");
                    let grown = Layout::from_size_align(size * 2 + 7, align).unwrap();
                    let r = Allocator.realloc(q, grown, size.div_ceil(2));
                    assert!(!r.is_null() && r as usize % align == 0, "{size} {align} shrunk");
                    assert!((0..size.div_ceil(2)).all(|i| *r.add(i) == 0xA5), "kept when shrunk");
                    Allocator.dealloc(r, Layout::from_size_align(size.div_ceil(2), align).unwrap());
                    let z = Allocator.alloc_zeroed(layout);
                    assert!(!z.is_null() && z as usize % align == 0, "{size} {align} zeroed");
                    assert!((0..size).all(|i| *z.add(i) == 0), "zeroed");
                    Allocator.dealloc(z, layout);
                }
            }
        }
    }
}
