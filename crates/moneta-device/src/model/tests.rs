//! The model's timelines against times worked out by hand from the parameters, and its policies,
//! barriers, energy and wear.

use super::*;

/// The paper's array with nothing but the data path: FIFO, no wake-up, no wear leveling and
/// rows mapped in order, so that every time below can be worked out by hand. Reads of 4 KB
/// take 48 ns to open a row and 1024 ns to move at 4 B/ns; the ring moves 4 KB in 1024 ns
/// and the link in 2048 ns.
fn plain(policy: Policy) -> ModelConfig {
    let mut c = ModelConfig::pcm();
    c.policy = policy;
    c.wake_ns = 0.0;
    c.gap_interval = 0;
    c.randomize = false;
    c
}

fn req(id: u64, write: bool, addr: u64, len: u64, channel: u32) -> Submit {
    Submit {
        id,
        write,
        addr,
        len,
        channel,
        barrier: false,
        reach: 0,
    }
}

const SECOND: u64 = 1_000_000_000;

/// Submits everything at time 0 and runs to the end: (id, completion ns), by id.
fn run(cfg: ModelConfig, reqs: &[Submit]) -> Vec<(u64, u64)> {
    let mut m = Model::new(cfg, 1 << 30, 1).unwrap();
    for r in reqs {
        m.submit(*r, 0);
    }
    let mut out = Vec::new();
    m.advance(SECOND, |id, t| out.push((id, t)));
    assert_eq!(m.pending(), 0);
    out.sort();
    out
}

#[test]
fn one_read() {
    // Row open 48 + controller 1024 = 1072; ring to 2096; link to 4144.
    assert_eq!(
        run(plain(Policy::Fifo), &[req(1, false, 0, 4096, 0)]),
        [(1, 4144)]
    );
}

#[test]
fn one_write() {
    // Link 2048; ring to 3072; the controller reads the half row in (48), moves 4 KB (1024)
    // and writes the row back (150): 4294, durable.
    assert_eq!(
        run(plain(Policy::Fifo), &[req(1, true, 0, 4096, 0)]),
        [(1, 4294)]
    );
}

#[test]
fn a_whole_row_write_needs_no_read_in() {
    // 8 KB: link 4096, ring 2048 (6144), controller 2048 + 150.
    assert_eq!(
        run(plain(Policy::Fifo), &[req(1, true, 0, 8192, 0)]),
        [(1, 8342)]
    );
}

#[test]
fn two_reads_to_one_controller_queue_behind_each_other() {
    // 8 KB each; address 32K is stripe 4, controller 0 again (row 1).
    // First: controller 0..2096, ring ..4144, link ..8240.
    // Second (other buffer): its controller waits for the outgoing queue (free when the
    // ring has taken the first, 4144): ..6240; ring 6240..8288; link waits for the first
    // (8240): 8288..12384.
    assert_eq!(
        run(
            plain(Policy::Fifo),
            &[req(1, false, 0, 8192, 0), req(2, false, 32 << 10, 8192, 0)]
        ),
        [(1, 8240), (2, 12384)]
    );
}

#[test]
fn a_request_striped_over_four_controllers() {
    // 32 KB: four 8 KB transfers on controllers 0-3, all commanded at 0 (controllers ..2096);
    // each holds one of the two buffers from the ring to the end of its DMA.
    // T1: ring 2096..4144, link ..8240, buffer 0 until 8240.
    // T2: ring 4144..6192, link 8240..12336, buffer 1 until 12336.
    // T3: buffer 0 from 8240: ring 8240..10288, link 12336..16432.
    // T4: the ring is free at 10288 but no buffer is until 12336 (buffer 1): ring
    //     12336..14384, link 16432..20528.
    assert_eq!(
        run(plain(Policy::Fifo), &[req(1, false, 0, 32 << 10, 0)]),
        [(1, 20528)]
    );
}

#[test]
fn large_transfers_fill_the_link() {
    // 64 MB of reads: within 1% of the link's 2 B/ns once the pipeline is full.
    let total = 64u64 << 20;
    let done = run(plain(Policy::Fifo), &[req(1, false, 0, total, 0)]);
    let rate = total as f64 / done[0].1 as f64;
    assert!((rate - 2.0).abs() / 2.0 < 0.01, "{rate} B/ns");
    let done = run(plain(Policy::Fifo), &[req(1, true, 0, total, 0)]);
    let rate = total as f64 / done[0].1 as f64;
    assert!((rate - 2.0).abs() / 2.0 < 0.01, "{rate} B/ns");
}

#[test]
fn two_queues_use_both_directions_of_the_link() {
    // 64 KB reads and writes in turn, 2 MB in all.
    let mixed: Vec<Submit> = (0..32u64)
        .map(|i| req(i, i % 2 == 1, i * (64 << 10), 64 << 10, i as u32))
        .collect();
    let end = |p: Policy| run(plain(p), &mixed).iter().map(|x| x.1).max().unwrap();
    let (fifo, two) = (end(Policy::Fifo), end(Policy::TwoQueue));
    // Two 8 KB buffers limit the pair of directions to about 2.7 B/ns (each transfer holds a
    // buffer for about 6 µs); Moneta+2Q reached 71% of the link's 4 GB/s both ways.
    let rate = (2u64 << 20) as f64 / two as f64;
    assert!(rate > 2.4 && rate < 2.8, "2Q {rate} B/ns");
    assert!(
        fifo as f64 > 1.2 * two as f64,
        "FIFO {fifo} ns, 2Q {two} ns"
    );
}

#[test]
fn round_robin_lets_a_small_read_pass_a_large_one() {
    let big_then_small = [
        req(1, false, 0, 512 << 10, 0),
        req(2, false, 1 << 20, 4096, 1),
    ];
    let fifo = run(plain(Policy::TwoQueue), &big_then_small);
    let rr = run(plain(Policy::RoundRobin), &big_then_small);
    // In order, the small read waits for all 64 transfers of the large one; round-robin
    // serves it after one of them.
    assert!(fifo[1].1 > fifo[0].1, "{fifo:?}");
    assert!(rr[1].1 * 10 < fifo[1].1, "FIFO {fifo:?} RR {rr:?}");
    // The large one hardly notices.
    assert!(rr[0].1 <= fifo[0].1 + 5000, "FIFO {fifo:?} RR {rr:?}");
}

#[test]
fn a_barrier_holds_later_requests_of_its_channel_only() {
    let mut w = req(1, true, 0, 4096, 0);
    w.barrier = true;
    let after = req(2, false, 8 << 10, 4096, 0);
    let other = req(3, false, 16 << 10, 4096, 1);
    let done = run(plain(Policy::RoundRobin), &[w, after, other]);
    // At 0 the two queues each have a request; the read queue goes first. The other
    // channel's read is not held: controller 2 ..1072, ring 1072..2096, link ..4144.
    assert_eq!(done[2], (3, 4144));
    // The write: link 0..2048, ring 2096..3120 (after the read), its controller reads the
    // half row in, moves 4 KB and writes the row back: 3120 + 48 + 1024 + 150 = 4342.
    assert_eq!(done[0], (1, 4342));
    // The read after the barrier issues when the write has ended, on controller 1:
    // 4342 + 48 + 1024 = 5414; ring 5414..6438; link 6438..8486.
    assert_eq!(done[1], (2, 8486));
    // In order (FIFO), the held read holds up the other channel's read behind it: it issues
    // at 4294 too, and queues behind request 2 on the ring (6390..7414) and the link
    // (8438..10486).
    let fifo = run(plain(Policy::Fifo), &[w, after, other]);
    assert_eq!(fifo, [(1, 4294), (2, 8438), (3, 10486)]);
}

#[test]
fn decisions_wait_for_the_clock() {
    // A large read is under way when a small read arrives; round-robin serves the small one
    // next even though the large one was taken first, because the model decides each
    // transfer only when the clock reaches it.
    let mut m = Model::new(plain(Policy::RoundRobin), 1 << 30, 1).unwrap();
    let mut out = Vec::new();
    m.submit(req(1, false, 0, 1 << 20, 0), 0);
    m.advance(100, |id, t| out.push((id, t)));
    assert!(out.is_empty());
    m.submit(req(2, false, 8 << 20, 4096, 1), 100);
    let next = m.next_event_ns().unwrap();
    assert!(next >= 100);
    m.advance(SECOND, |id, t| out.push((id, t)));
    out.sort();
    assert!(out[1].1 < out[0].1 / 10, "{out:?}");
    assert!(m.next_event_ns().is_none());
}

#[test]
fn slower_memory_is_hidden_by_more_controllers() {
    let mut c = plain(Policy::RoundRobin);
    c.read_ns = 4000.0;
    let reads: Vec<Submit> = (0..64)
        .map(|i| req(i, false, i * (8 << 10), 8 << 10, i as u32))
        .collect();
    let end = |cfg: ModelConfig| run(cfg, &reads).iter().map(|x| x.1).max().unwrap();
    let one = {
        let mut c = c.clone();
        c.controllers = 1;
        end(c)
    };
    let eight = {
        let mut c = c.clone();
        c.controllers = 8;
        c.sched_buffers = 16;
        end(c)
    };
    // One controller streams a row per 4 µs open + 2 µs move + 2 µs ring (its one outgoing
    // queue waits for the ring); eight keep the link full: 512 KB at 2 B/ns.
    assert!(
        (eight as f64) < one as f64 / 1.8,
        "1 controller {one} ns, 8 controllers {eight} ns"
    );
    let link_bound = (512u64 << 10) / 2;
    assert!(eight < link_bound * 105 / 100, "8 controllers {eight} ns");
}

/// The completion times of a mixed stream (sizes from 512 B to several stripes, reads and
/// writes, five channels, some barriers and hints, arrivals spread over time) on `cfg`; with
/// `forget`, every calendar is cleared of what ended by the last decision after each step.
fn mixed_stream(cfg: ModelConfig, forget: bool) -> Vec<(u64, u64)> {
    let region = 64u64 << 20;
    let mut m = Model::new(cfg, region, 3).unwrap();
    let mut out = Vec::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut now = 0;
    for id in 0..4000 {
        let len = [512, 3000, 4096, 8192, 20_000, 65_536][(rnd() % 6) as usize];
        let addr = (rnd() % (region - len)) & !511;
        if rnd() % 13 == 0 {
            m.hint(addr + len, 32_768, now);
        }
        let s = Submit {
            id,
            write: rnd() % 3 == 0,
            addr,
            len,
            channel: (rnd() % 5) as u32,
            barrier: rnd() % 29 == 0,
            reach: addr + len + 65_536,
        };
        m.submit(s, now);
        now += rnd() % 4000;
        m.advance(now, |id, t| out.push((id, t)));
        if forget {
            m.forget_past();
        }
    }
    m.advance(u64::MAX / PS, |id, t| out.push((id, t)));
    out
}

#[test]
fn decisions_depend_only_on_what_lies_ahead_of_the_clock() {
    // A write that arrived before the last decision must not find a buffer in the past: the
    // calendars forget it, so the time it issues would depend on how much they remember.
    for policy in [Policy::Fifo, Policy::TwoQueue, Policy::RoundRobin] {
        for buffer in [0, 1 << 20] {
            let mut cfg = ModelConfig::pcm();
            cfg.policy = policy;
            cfg.buffer = buffer;
            let a = mixed_stream(cfg.clone(), false);
            let b = mixed_stream(cfg, true);
            assert_eq!(
                a.len(),
                4000,
                "{policy:?}, buffer {buffer}: every request completes"
            );
            assert!(
                a == b,
                "{policy:?}, buffer {buffer}: the past changed a decision"
            );
        }
    }
}

#[test]
fn energy_adds_up_and_idles_at_the_idle_power() {
    let cfg = ModelConfig::pcm();
    let p = cfg.power;
    let mut m = Model::new(cfg.clone(), 1 << 30, 1).unwrap();
    m.submit(req(1, true, 0, 8192, 0), 0);
    m.advance(SECOND, |_, _| {});
    let s = m.stats(SECOND);
    let e = s.energy;
    let sum = e.scheduler_j
        + e.buffers_j
        + e.ring_j
        + e.link_j
        + e.controllers_j
        + e.array_j
        + e.background_j;
    assert!((e.total_j() - sum).abs() < 1e-12);
    // One second with one 8 KB write: nearly all of it idle power.
    let idle = p.scheduler_w.0
        + p.ring_w.0
        + 2.0 * p.sched_buffer_w.0
        + 4.0 * (p.controller_w.0 + p.ctrl_buffer_w.0)
        + p.link_w.0;
    let dies = ((1u64 << 30) * 8).div_ceil(p.die_bits) as f64;
    let background = dies * p.idle_die_w;
    assert!(
        (s.watts() - idle - background).abs() < 0.01,
        "{} W, idle {} W",
        s.watts(),
        idle + background
    );
    // The write programmed one whole row.
    assert!(
        (e.array_j - (8192.0 * 8.0 * (p.array_write_pj + p.buffer_write_pj)) * 1e-12).abs() < 1e-12
    );
    assert_eq!((s.writes, s.bytes_written, s.transfers), (1, 8192, 1));
}

#[test]
fn small_writes_cost_more_energy_per_byte() {
    // Moneta §V-D: 512 B writes program whole rows, so they cost far more per byte than 8 KB.
    let per_byte = |len: u64| {
        let mut m = Model::new(ModelConfig::pcm(), 1 << 30, 1).unwrap();
        for i in 0..256u64 {
            m.submit(req(i, true, i * (8 << 10), len, 0), 0);
        }
        m.advance(SECOND, |_, _| {});
        m.stats(0).energy.array_j / (256 * len) as f64
    };
    assert!(per_byte(512) > 10.0 * per_byte(8192));
}

#[test]
fn start_gap_spreads_a_hot_spot() {
    let hot = |gap: u64| {
        let mut c = ModelConfig::pcm();
        c.gap_interval = gap;
        c.randomize = gap > 0;
        // A small array so the gap sweeps it many times.
        let mut m = Model::new(c, 4 << 20, 3).unwrap();
        for i in 0..20_000u64 {
            m.submit(req(i, true, (i % 4) * (8 << 10), 8192, 0), 0);
            m.advance(SECOND, |_, _| {});
        }
        m.wear()
    };
    let off = hot(0);
    // The gap sweeps each controller's 129 rows about 39 times: each hot line visits about
    // as many physical rows.
    let on = hot(1);
    assert_eq!(off.max, 5000, "four hot rows take every write");
    assert!(
        (on.max as f64) < off.max as f64 / 10.0,
        "with start-gap {on:?}, without {off:?}"
    );
    assert!(on.total > off.total, "gap moves write too");
}

#[test]
fn wear_survives_a_round_trip() {
    let mut m = Model::new(ModelConfig::pcm(), 64 << 20, 5).unwrap();
    for i in 0..1000u64 {
        m.submit(req(i, true, (i * 7919 % 8192) * 8192, 8192, 0), 0);
    }
    m.advance(SECOND, |_, _| {});
    let state = m.wear_state();
    let mut again = Model::new(ModelConfig::pcm(), 64 << 20, 5).unwrap();
    assert!(again.restore_wear(&state));
    assert_eq!(again.wear(), m.wear());
    let mut small = Model::new(ModelConfig::pcm(), 32 << 20, 5).unwrap();
    assert!(!small.restore_wear(&state), "another size does not fit");
}

#[test]
fn wear_kept_in_a_file_continues_where_it_stopped() {
    let dir = std::env::temp_dir().join(format!("moneta-wear-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = dir.join("device.img");
    let write_some = |m: &mut Model, from: u64| {
        for i in from..from + 500 {
            m.submit(req(i, true, (i * 7919 % 512) * 8192, 8192, 0), 0);
        }
        m.advance(SECOND, |_, _| {});
    };
    let mut c = ModelConfig::pcm();
    c.gap_interval = 7;
    let mut a = Model::new(c.clone(), 16 << 20, 9).unwrap();
    let path = a.keep_wear_in(&base).unwrap().path().to_path_buf();
    assert!(!a.wear_file().unwrap().restored);
    write_some(&mut a, 0);
    let first = a.wear_state();
    // What a killed process leaves: the mapping as it was (nothing written back explicitly).
    drop(a);
    let mut b = Model::new(c.clone(), 16 << 20, 9).unwrap();
    assert_eq!(b.keep_wear_in(&base).unwrap().path(), path);
    assert!(b.wear_file().unwrap().restored);
    assert_eq!(b.wear_state(), first, "counts and registers come back");
    // A model that never stopped, for comparison: the continued one matches it exactly.
    let mut whole = Model::new(c.clone(), 16 << 20, 9).unwrap();
    write_some(&mut whole, 0);
    write_some(&mut whole, 500);
    write_some(&mut b, 500);
    assert_eq!(b.wear_state(), whole.wear_state());
    // Another geometry keeps a file of its own; a damaged file is refused with the reason.
    let mut other = c.clone();
    other.controllers = 2;
    let mut o = Model::new(other, 16 << 20, 9).unwrap();
    assert_ne!(o.keep_wear_in(&base).unwrap().path(), path);
    drop(b);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"garbage!", 0).unwrap();
    let mut d = Model::new(c.clone(), 16 << 20, 9).unwrap();
    let e = d.keep_wear_in(&base).unwrap_err();
    assert!(e.contains("move it away"), "{e}");
    f.set_len(100).unwrap();
    let e = d.keep_wear_in(&base).unwrap_err();
    assert!(e.contains("bytes"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_first_barrier_also_waits_for_requests_that_came_before_barriers_were_counted() {
    // A slow write, then (nothing counted yet) a barrier NOP-like read on the same channel,
    // then a read after it: the last read issues only once the write and the barrier ended.
    let slow = {
        let mut c = plain(Policy::RoundRobin);
        c.write_ns = 100_000.0;
        c
    };
    let w = req(1, true, 0, 4096, 7);
    let mut b = req(2, false, 1 << 20, 512, 7);
    b.barrier = true;
    let after = req(3, false, 2 << 20, 512, 7);
    let done = run(slow.clone(), &[w, b, after]);
    let end_of = |id: u64| done.iter().find(|d| d.0 == id).unwrap().1;
    assert!(end_of(1) > 100_000);
    assert!(end_of(3) > end_of(1) && end_of(3) > end_of(2), "{done:?}");
    // Without the barrier the read does not wait for the write.
    let b2 = req(2, false, 1 << 20, 512, 7);
    let done = run(slow, &[w, b2, after]);
    assert!(done[2].1 < 100_000, "{done:?}");
}

/// [`plain`] FIFO with a DRAM buffer of 1 MiB in 4 KiB lines: a hit of 4 KiB costs 50 ns,
/// 409.6 ns at 10 B/ns and the link's 2048 ns.
fn buffered(readahead: u64) -> ModelConfig {
    let mut c = plain(Policy::Fifo);
    c.buffer = 1 << 20;
    c.readahead = readahead;
    c
}

/// Reads one after the other, each submitted at `at` or when the one before completed:
/// (addr, len, reach) → completion times.
fn serial(m: &mut Model, at: u64, reads: &[(u64, u64, u64)]) -> Vec<u64> {
    let mut t = at;
    let mut out = Vec::new();
    for (i, &(addr, len, reach)) in reads.iter().enumerate() {
        m.submit(
            Submit {
                reach,
                ..req(i as u64, false, addr, len, 0)
            },
            t,
        );
        let mut done = None;
        while done.is_none() {
            m.advance(t, |_, d| done = Some(d));
            t = m.next_event_ns().unwrap_or(t).max(t + 1);
        }
        t = done.unwrap();
        out.push(t);
    }
    out
}

#[test]
fn a_read_the_buffer_holds_costs_the_buffer_not_the_array() {
    let mut m = Model::new(buffered(0), 1 << 30, 1).unwrap();
    // A miss is the plain read (4144), and leaves its line in the buffer.
    assert_eq!(serial(&mut m, 0, &[(0, 4096, 0)]), [4144]);
    // At 10 µs the same line: 10000 + 50 + 409.6 + 2048.
    assert_eq!(serial(&mut m, 10_000, &[(0, 4096, 0)]), [12508]);
    // Bytes of two lines, one of them absent: a miss that reads both lines whole
    // (48 + 2048, ring 2048) and sends the 200 bytes asked (100 ns) from 24096.
    assert_eq!(serial(&mut m, 20_000, &[(4000, 200, 0)]), [24196]);
    let b = m.stats(30_000).buffer.unwrap();
    assert_eq!((b.hits, b.misses, b.lines), (1, 2, 2));
    assert_eq!((b.ahead_lines, b.hinted_lines), (0, 0));
    assert!(Model::new(plain(Policy::Fifo), 1 << 30, 1)
        .unwrap()
        .stats(0)
        .buffer
        .is_none());
}

#[test]
fn a_hint_fills_the_buffer_ahead_of_the_read() {
    // Hinted at 0: controller 0 reads 8 KB (48 + 2048), the ring carries it by 4144.
    let mut m = Model::new(buffered(0), 1 << 30, 1).unwrap();
    m.hint(0, 8192, 0);
    assert_eq!(serial(&mut m, 5_000, &[(0, 4096, 0)]), [7508]);
    // A read before the line is in waits for it: 4144 + 50 + 409.6 + 2048.
    let mut m = Model::new(buffered(0), 1 << 30, 1).unwrap();
    m.hint(0, 8192, 0);
    assert_eq!(serial(&mut m, 1_000, &[(4096, 4096, 0)]), [6652]);
    let b = m.stats(10_000).buffer.unwrap();
    assert_eq!(
        (b.hits, b.waited, b.hinted_lines, b.used_ahead),
        (1, 1, 2, 1)
    );
    // Without the hint the read goes to the array: 5000 + 4144.
    let mut m = Model::new(buffered(0), 1 << 30, 1).unwrap();
    assert_eq!(serial(&mut m, 5_000, &[(0, 4096, 0)]), [9144]);
    // Without a buffer a hint fills nothing.
    let mut m = Model::new(plain(Policy::Fifo), 1 << 30, 1).unwrap();
    m.hint(0, 8192, 0);
    assert_eq!(serial(&mut m, 5_000, &[(0, 4096, 0)]), [9144]);
    // A hint fills at most HINT_LINES lines from its start, and no more than the buffer
    // holds (4 lines of 16 KiB here).
    let mut m = Model::new(buffered(0), 1 << 30, 1).unwrap();
    m.hint(0, 64 << 20, 0);
    let b = m.stats(0).buffer.unwrap();
    assert_eq!(
        (b.hinted_lines, b.lines, b.evictions),
        (HINT_LINES, HINT_LINES, 0)
    );
    let mut small = buffered(0);
    small.buffer = 16 << 10;
    let mut m = Model::new(small, 1 << 30, 1).unwrap();
    m.hint(0, 64 << 20, 0);
    let b = m.stats(0).buffer.unwrap();
    assert_eq!((b.hinted_lines, b.lines, b.evictions), (4, 4, 0));
}

#[test]
fn read_ahead_stays_within_the_extent() {
    for (reach, ahead) in [(0, 0), (4096, 0), (16 << 10, 3), (1 << 20, 8)] {
        let mut m = Model::new(buffered(32 << 10), 1 << 30, 1).unwrap();
        serial(&mut m, 0, &[(0, 4096, reach)]);
        let b = m.stats(0).buffer.unwrap();
        assert_eq!(b.ahead_lines, ahead, "reach {reach}");
    }
}

#[test]
fn sequential_reads_hit_what_read_ahead_filled_and_strided_ones_waste_it() {
    let seq: Vec<_> = (0..64).map(|i| (i * 4096, 4096, 1 << 30)).collect();
    let strided: Vec<_> = (0..64).map(|i| (i * 65536, 4096, 1 << 30)).collect();
    let mut plain_m = Model::new(buffered(0), 1 << 30, 1).unwrap();
    let t_plain = *serial(&mut plain_m, 0, &seq).last().unwrap();
    let mut m = Model::new(buffered(32 << 10), 1 << 30, 1).unwrap();
    let t_ahead = *serial(&mut m, 0, &seq).last().unwrap();
    let b = m.stats(t_ahead).buffer.unwrap();
    assert_eq!((b.misses, b.hits), (1, 63));
    assert!(t_ahead < t_plain, "{t_ahead} against {t_plain}");
    // Strided reads use none of the lines read ahead of them.
    let mut m = Model::new(buffered(32 << 10), 1 << 30, 1).unwrap();
    let end = *serial(&mut m, 0, &strided).last().unwrap();
    let b = m.stats(end).buffer.unwrap();
    assert_eq!((b.hits, b.misses, b.used_ahead), (0, 64, 0));
    assert_eq!(b.ahead_lines, 64 * 8);
}

#[test]
fn the_buffer_writes_through_and_allocates_nothing_on_a_write() {
    let mut m = Model::new(buffered(0), 1 << 30, 1).unwrap();
    m.submit(req(1, true, 0, 4096, 0), 0);
    m.advance(SECOND, |_, _| {});
    // The written line is not in the buffer: the read goes to the array.
    serial(&mut m, SECOND, &[(0, 4096, 0)]);
    // It is now; a write leaves it there (up to date), and the next read hits.
    m.submit(req(2, true, 0, 4096, 0), 2 * SECOND);
    m.advance(3 * SECOND, |_, _| {});
    serial(&mut m, 3 * SECOND, &[(0, 4096, 0)]);
    let b = m.stats(4 * SECOND).buffer.unwrap();
    assert_eq!((b.misses, b.hits), (1, 1));
    assert_eq!(m.stats(4 * SECOND).writes, 2);
}
