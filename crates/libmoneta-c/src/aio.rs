//! Asynchronous requests: submitted reads and writes, polled or waited for one at a time,
//! any of several, or all.

use super::*;

fn start_req(f: &MonetaFile, r: Result<Pending<'_>, ClientError>) -> *mut MonetaReq {
    match r {
        Ok(p) => {
            f.requests.fetch_add(1, Ordering::AcqRel);
            // SAFETY: the request borrows `f.f`; moneta_close refuses while `requests` counts
            // it, so the file outlives the request.
            let p: Pending<'static> = unsafe { std::mem::transmute(p) };
            Box::into_raw(Box::new(MonetaReq {
                p,
                file: f as *const MonetaFile,
            }))
        }
        Err(e) => fail(e, std::ptr::null_mut()),
    }
}

/// Submits a read of `n` bytes at `off` into `buf`, which must stay valid until the request
/// is waited for or freed. Returns at once.
#[no_mangle]
pub unsafe extern "C" fn moneta_submit_read(
    f: *const MonetaFile,
    buf: *mut c_void,
    n: usize,
    off: i64,
) -> *mut MonetaReq {
    let f = obj!(f, std::ptr::null_mut());
    if buf.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return std::ptr::null_mut();
    }
    // SAFETY: the caller keeps `buf` valid for `n` bytes until the request ends.
    let r = offset(off).and_then(|o| unsafe { f.f.submit_read_raw(buf.cast(), n, o, None) });
    start_req(f, r)
}

/// Submits a write of `n` bytes from `buf` at `off` (at the end for a file opened with
/// `O_APPEND`); `buf` must stay valid and unchanged until the request ends. Returns at once.
#[no_mangle]
pub unsafe extern "C" fn moneta_submit_write(
    f: *const MonetaFile,
    buf: *const c_void,
    n: usize,
    off: i64,
) -> *mut MonetaReq {
    let f = obj!(f, std::ptr::null_mut());
    if buf.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return std::ptr::null_mut();
    }
    // SAFETY: the caller keeps `buf` valid for `n` bytes until the request ends.
    let r = offset(off).and_then(|o| unsafe { f.f.submit_write_raw(buf.cast(), n, o, None) });
    start_req(f, r)
}

/// Whether the request has ended (1) or not (0), moving it along without blocking.
#[no_mangle]
pub unsafe extern "C" fn moneta_poll(r: *mut MonetaReq) -> c_int {
    // SAFETY: the caller passes a live request.
    match unsafe { r.as_mut() } {
        Some(r) => r.p.poll() as c_int,
        None => {
            set_errno(libc::EFAULT);
            -1
        }
    }
}

unsafe fn finish(r: *mut MonetaReq) -> libc::ssize_t {
    // SAFETY: `r` came from a submit call and is freed once, here.
    let mut b = unsafe { Box::from_raw(r) };
    let res = b.p.wait();
    let file = b.file;
    drop(b);
    // SAFETY: the file outlives its requests (see start_req).
    unsafe { &*file }.requests.fetch_sub(1, Ordering::AcqRel);
    count(res)
}

/// Waits for the request to end and frees it: the bytes moved, or -1 and `errno`.
#[no_mangle]
pub unsafe extern "C" fn moneta_wait(r: *mut MonetaReq) -> libc::ssize_t {
    if r.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: per the caller.
    unsafe { finish(r) }
}

/// Frees a request without its result (waiting for the device to be done with it).
#[no_mangle]
pub unsafe extern "C" fn moneta_req_free(r: *mut MonetaReq) {
    if !r.is_null() {
        // SAFETY: per the caller.
        let _ = unsafe { finish(r) };
    }
}

/// Waits until one of the non-NULL requests in `reqs[0..n]` ends; stores its index in
/// `*index`, frees it, sets `reqs[*index]` to NULL and returns its result (bytes, or -1 and
/// `errno`). With no request left: -1 and `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn moneta_wait_any(
    reqs: *mut *mut MonetaReq,
    n: usize,
    index: *mut usize,
) -> libc::ssize_t {
    if reqs.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller passes `n` request slots.
    let slots = unsafe { slice_mut_of(reqs, n) };
    if slots.iter().all(|r| r.is_null()) {
        set_errno(libc::EINVAL);
        return -1;
    }
    let mut rounds = 0u32;
    loop {
        for (i, slot) in slots.iter_mut().enumerate() {
            // SAFETY: non-NULL slots hold live requests.
            let Some(r) = (unsafe { slot.as_mut() }) else {
                continue;
            };
            if r.p.poll() {
                let done = std::mem::replace(slot, std::ptr::null_mut());
                if !index.is_null() {
                    // SAFETY: the caller passes a writable index or NULL.
                    unsafe { *index = i };
                }
                // SAFETY: `done` is live and freed once.
                return unsafe { finish(done) };
            }
        }
        rounds += 1;
        if rounds < 2000 {
            std::hint::spin_loop();
        } else if rounds < 2100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
}

/// Waits for every non-NULL request in `reqs[0..n]`, frees them and sets the slots to NULL;
/// `results[i]` (if `results` is not NULL) gets bytes moved or a negative errno. Returns 0.
#[no_mangle]
pub unsafe extern "C" fn moneta_wait_all(
    reqs: *mut *mut MonetaReq,
    n: usize,
    results: *mut libc::ssize_t,
) -> c_int {
    if reqs.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller passes `n` request slots and, unless NULL, `n` results.
    let slots = unsafe { slice_mut_of(reqs, n) };
    for (i, slot) in slots.iter_mut().enumerate() {
        let r = std::mem::replace(slot, std::ptr::null_mut());
        if r.is_null() {
            continue;
        }
        // SAFETY: a live request, freed once.
        let v = unsafe { finish(r) };
        let v = if v < 0 {
            // SAFETY: errno of this thread.
            -(unsafe { *libc::__errno_location() } as libc::ssize_t)
        } else {
            v
        };
        if !results.is_null() {
            // SAFETY: per the caller.
            unsafe { *results.add(i) = v };
        }
    }
    0
}
