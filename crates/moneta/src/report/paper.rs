//! What the papers' figures show, for comparison beside this project's measurements in
//! `moneta report`.
//! Numbers are the papers'; "about" marks values read from a plot.

/// The paper's figure for an experiment: its name and what it shows.
pub struct PaperFigure {
    /// Which figure or table, e.g. "Moneta-D Figure 3".
    pub figure: &'static str,
    /// What it shows, in a few sentences.
    pub shows: &'static str,
}

/// The paper's figure behind experiment `id`, if there is one.
pub fn figure(id: &str) -> Option<PaperFigure> {
    Some(match id {
        "breakdown" => PaperFigure {
            figure: "Moneta-D Figure 3",
            shows: "512 B read/write latency in µs: the baseline totals 15.36/16.78, of which \
                hardware+DMA 1.26/2.18, copy 0.17/0.13, file system 4.21/4.64, system call \
                3.90/3.96 and interrupt completion 5.82/5.87. Moneta-D cuts the file system to \
                0.21/0.29 and the system call to 0, adding extent lookup 0.12-0.23 and permission \
                check 0.06-0.13 (1 vs 1K extents). Completion: DMA 2.32/2.68, OS forwarding \
                2.71/2.36, issue-sleep 14.65/14.29; a soft miss costs 7.28-29.9, a hard miss \
                14.7-38.1.",
        },
        "bandwidth" => PaperFigure {
            figure: "Moneta-D Figure 7",
            shows: "Bandwidth against request size for reads (a) and writes (b), baseline Moneta \
                and Moneta-D, each with and without a file system. For writes the file system \
                cuts baseline bandwidth by up to 13x but barely affects Moneta-D; for reads the \
                baseline loses at most 34%. With a file system, small-write throughput rises 26x \
                and Moneta-D sustains 1.8M 512 B IOPS.",
        },
        "completion" => PaperFigure {
            figure: "Moneta-D Figure 5",
            shows: "32 threads, 50/50 random reads and writes. In bandwidth (a), DMA completion \
                beats OS forwarding and issue-sleep by 21% to 171% for accesses up to 8 KB; \
                issue-sleep is poor for small accesses and near forwarding for large ones. In \
                bandwidth per CPU (b), the two spinning schemes fare poorly for large requests \
                and issue-sleep gives up to 7x more, the best choice from 8 KB up.",
        },
        "permissions" => PaperFigure {
            figure: "Moneta-D Figure 4",
            shows: "One process doing random 4 KB accesses over 2,048 to 32,768 extents, \
                throughput in kilo-operations per second, with and without merging of \
                physically adjacent extents. Without merging, throughput stays high until the \
                16K-entry permission table is full, then drops steeply as hard misses rise; \
                with merging it stays high even at 2x the table size.",
        },
        "async" => PaperFigure {
            figure: "Moneta-D Figure 9",
            shows: "Synchronous vs asynchronous Moneta-D, 1 and 8 threads, 512 B to 256 KB: \
                with 1 thread async raises bandwidth 1.1x to 3.0x (caption: up to 3.5x; the \
                abstract says 5.5x at 4 KB); with 8 threads it helps only from 4 KB up. For \
                16 KB accesses (b), async gives 2.8x more bandwidth per CPU with 1 thread, an \
                edge that shrinks as threads are added.",
        },
        "iops" => PaperFigure {
            figure: "Moneta Table III",
            shows: "IOPS and instructions per 4 KB IO, read/write. Moneta+Spin: \
                368,534/389,859 at 4 KB, 1,156,779/1,043,793 at 512 B, 17,364/20,744 \
                instructions. FusionIO: 92,225/70,579 and 132,826/71,338 IOPS, 49,369/60,147 \
                instructions; Moneta's driver needs 38-47% fewer instructions than the RAID \
                arrays (31,251-34,071).",
        },
        "kernel-fs" => PaperFigure {
            figure: "Moneta-D §5, Figure 7",
            shows: "Moneta-D recycles XFS: the kernel checks each open and installs the file's \
                extents in the device's permission table, after which the process reads and \
                writes the file through its channel with no system call. Against the baseline \
                (the same XFS through the kernel and Moneta's block driver), bandwidth against \
                request size for reads (a) and writes (b): for writes XFS cuts the baseline's \
                bandwidth by up to 13x but barely affects Moneta-D; for reads the baseline \
                loses at most 34%. With the file system, small-write throughput rises 26x and \
                Moneta-D sustains 1.8M 512 B IOPS.",
        },
        "apps" => PaperFigure {
            figure: "Moneta-D Table 3",
            shows: "Moneta-D speedup over baseline Moneta, best thread count of 1-16: \
                Berkeley-DB B-tree 2.6x (8,202 to 21,652 ops/s) and hash 5.7x (10,988 to \
                62,124 ops/s); SysBench OLTP Simple/Update/Complex 1.1x/1.4x/1.5x on MySQL and \
                1.3x/2.0x/1.5x on Postgres. Harmonic mean 1.7x over Moneta, 2.4x over FusionIO.",
        },
        "array-latency" => PaperFigure {
            figure: "Moneta Figure 4",
            shows: "Moneta+Balance bandwidth as the memory's latency grows from 4 ns to 128 µs, \
                with 1, 2, 4 and 8 memory controllers: adding controllers completely hides \
                latencies of up to 1 µs; 4 µs memories lose only 20% with eight controllers, \
                and at 4 µs doubling the controllers adds about 400 MB/s.",
        },
        "array-bandwidth" => PaperFigure {
            figure: "Moneta Figure 2",
            shows: "Bandwidth against access size: the 2 GB/s PCIe link (\"ideal\") limits \
                large accesses, and Moneta+Spin nearly saturates it for reads and for writes; \
                mixed reads and writes should do better on the full-duplex link, and \
                Moneta+2Q raises them by 75%, to 71% of the 4 GB/s both ways. Moneta sustains \
                2.8 GB/s sequential, 541K random 4 KB IOPS and 1.1M 512 B IOPS.",
        },
        "fairness" => PaperFigure {
            figure: "Moneta §IV-B",
            shows: "Four threads of 4 KB reads beside four of 512 KB reads: with each queue \
                served in order (Moneta+2Q) the 4 KB threads realize 16 MB/s (170 MB/s for one \
                alone) and the 512 KB threads 1.5 GB/s; round-robin service in 8 KB pieces \
                gives the 4 KB threads 12x more and costs the 512 KB threads 190 MB/s, the \
                aggregate unchanged.",
        },
        "power" => PaperFigure {
            figure: "Moneta §V-D, Table I",
            shows: "With four controllers the array without its memory draws at most 3.19 W; \
                total power for random 8 KB writes is 3.47 W. 512 B writes could reach 11 W \
                (8.34 W of memory at one controller), their efficiency in MB/s per watt 85% \
                below 8 KB writes'; reads peak at 2.5 W and 2.6 GB/s per controller for 512 B.",
        },
        "wear" => PaperFigure {
            figure: "Moneta §II-B",
            shows: "Each memory controller runs start-gap wear leveling with address \
                randomization (Qureshi et al.), which levels wear with less than 1% overhead; \
                a PCM bit lasts about 10^8 writes. The paper gives no wear figures of its own.",
        },
        "remote" => PaperFigure {
            figure: "The three Rs article, Figure 3b",
            shows: "Bandwidth against access size for distributed Moneta (a network interface \
                in the device forwards remote accesses to the device that holds the bytes) \
                against iSCSI and Fibre Channel storage networks: iSCSI adds 284 µs to a 4 KB \
                read and Fibre Channel 86 µs; distributed Moneta is 107 times iSCSI's \
                bandwidth for small requests and 4.5 times for large ones.",
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_experiment_has_a_figure() {
        let ids = [
            "breakdown",
            "bandwidth",
            "completion",
            "permissions",
            "async",
            "iops",
            "kernel-fs",
            "apps",
            "remote",
        ];
        for id in ids {
            let f = figure(id).unwrap_or_else(|| panic!("no paper figure for {id}"));
            assert!(!f.figure.trim().is_empty(), "{id}: empty figure name");
            assert!(!f.shows.trim().is_empty(), "{id}: empty text");
        }
        assert!(figure("no-such-experiment").is_none());
    }
}
