//! Records posted without waiting (`Device::post`, the soft miss's path) are applied before any
//! control request sent after the post returned, even when the poller is already busy with a
//! run of control requests: a removal must never be overtaken by an insert posted before it,
//! or a revoked record would come back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use moneta_device::{Device, DeviceConfig, MappedArray, SystemClock, TableOp, READ, WRITE};

#[test]
fn a_removal_is_never_overtaken_by_an_earlier_post() {
    let media = Arc::new(MappedArray::volatile(64 << 20).unwrap());
    let device =
        Arc::new(Device::start(DeviceConfig::default(), media, SystemClock::best()).unwrap());
    let ch = device.open_channel_for(None).unwrap();
    let other = device.open_channel_for(None).unwrap();
    // Another thread keeps the poller in its run of control requests.
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let (device, stop) = (device.clone(), stop.clone());
        let id = other.id;
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                device
                    .update(vec![TableOp::RemoveRange {
                        channel: id,
                        start: 0,
                        len: 4096,
                    }])
                    .unwrap();
            }
        })
    };
    for i in 0..20_000u64 {
        let start = (i % 1024) * 4096;
        device
            .post(vec![TableOp::Insert {
                channel: ch.id,
                start,
                len: 4096,
                rights: READ | WRITE,
                file: 0,
            }])
            .unwrap();
        device
            .update(vec![TableOp::RemoveRange {
                channel: ch.id,
                start,
                len: 4096,
            }])
            .unwrap();
        if i % 1000 == 999 {
            // No record may be left: each was removed after it was posted.
            assert_eq!(device.report().table_used, 0, "after {} rounds", i + 1);
        }
    }
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    assert_eq!(device.report().table_used, 0);
    let _ = device.shutdown();
}
