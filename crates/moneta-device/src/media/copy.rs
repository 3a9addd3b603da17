//! Copying into the array as a device's DMA engine writes its media.

/// Writes shorter than this are copied through the cache: streaming pays off only when whole
/// lines are written.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) const STREAM_MIN: usize = 1024;

/// Copies `len` bytes from `src` to `dst`, storing the whole cache lines of `dst` around the
/// cache (non-temporal stores), as a device's DMA engine writes its media: the line is not read
/// first and does not displace what the poller keeps in its cache (the channels, the permission
/// table). The ragged ends go through the cache. Ends with a store fence, so the data is
/// ordered before whatever the caller stores next (the completion).
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `len` bytes; the two do not overlap.
pub(super) unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= STREAM_MIN {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        const LINE: usize = 64;
        let head = dst.align_offset(LINE).min(len);
        let body = (len - head) / LINE * LINE;
        // SAFETY: every range below lies inside `[0, len)` of both buffers (the caller's
        // contract); the streamed stores go to 64-byte aligned lines of `dst` (`head` aligns
        // it), as `_mm_stream_si128` needs 16-byte alignment; SSE2 is part of x86_64.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let mut off = head;
            while off < head + body {
                let s = src.add(off).cast::<__m128i>();
                let d = dst.add(off).cast::<__m128i>();
                let a = _mm_loadu_si128(s);
                let b = _mm_loadu_si128(s.add(1));
                let c = _mm_loadu_si128(s.add(2));
                let e = _mm_loadu_si128(s.add(3));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
                off += LINE;
            }
            std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
            _mm_sfence();
        }
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}
