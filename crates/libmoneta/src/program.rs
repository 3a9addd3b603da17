//! What kind of program a file holds, from its first bytes: an ELF executable with or without a
//! program interpreter (dynamically or statically linked), or a `#!` script. Used to run
//! programs that are Moneta files and to tell which programs the preload shim cannot reach.

/// Bytes the kernel reads of a file to decide how to run it (`BINPRM_BUF_SIZE`): a `#!` line
/// longer than this is cut.
pub const HEAD: usize = 256;

/// Whether `head` starts an ELF file.
pub fn is_elf(head: &[u8]) -> bool {
    head.starts_with(b"\x7fELF")
}

/// Whether a 64-bit little-endian ELF file (its first bytes) has a `PT_INTERP` program header:
/// a dynamically linked executable, which the dynamic linker (and so `LD_PRELOAD`) serves.
/// Anything it cannot judge from the bytes given counts as dynamic.
pub fn has_interp(h: &[u8]) -> bool {
    let u16at = |o: usize| h.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32at = |o: usize| {
        h.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64at = |o: usize| {
        h.get(o..o + 8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    };
    if h.get(4) != Some(&2) || h.get(5) != Some(&1) {
        // Not ELF64 little-endian: leave the judgement to the linker.
        return true;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64at(0x20), u16at(0x36), u16at(0x38))
    else {
        return true;
    };
    for i in 0..phnum as usize {
        let Some(at) = (phoff as usize).checked_add(i * phentsize as usize) else {
            return true;
        };
        match u32at(at) {
            Some(3) => return true, // PT_INTERP
            Some(_) => {}
            // The table lies beyond the bytes read: assume a normal executable.
            None => return true,
        }
    }
    false
}

/// The interpreter and its one optional argument of a `#!` script, as the kernel reads them:
/// the first line (at most [`HEAD`] bytes), blanks around, the interpreter up to the first
/// blank, the rest of the line as one argument. `None` for a file that is not a script, or
/// whose `#!` line names nothing.
pub fn shebang(head: &[u8]) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let rest = head.strip_prefix(b"#!")?;
    let rest = &rest[..rest.len().min(HEAD - 2)];
    let line = rest.split(|&b| b == b'\n').next().unwrap_or(rest);
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = line.iter().position(|b| !blank(b))?;
    let line = &line[start..];
    let end = line.iter().rposition(|b| !blank(b)).map_or(0, |e| e + 1);
    let line = &line[..end];
    match line.iter().position(blank) {
        None => Some((line.to_vec(), None)),
        Some(i) => {
            let arg = &line[i..];
            let a = arg.iter().position(|b| !blank(b)).unwrap_or(arg.len());
            let arg = &arg[a..];
            Some((line[..i].to_vec(), (!arg.is_empty()).then(|| arg.to_vec())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_read_as_the_kernel_reads_them() {
        assert_eq!(
            shebang(b"#!/bin/sh\necho"),
            Some((b"/bin/sh".to_vec(), None))
        );
        assert_eq!(
            shebang(b"#! /usr/bin/env  python3 -u \nx"),
            Some((b"/usr/bin/env".to_vec(), Some(b"python3 -u".to_vec())))
        );
        assert_eq!(shebang(b"#!\n"), None);
        assert_eq!(shebang(b"\x7fELF"), None);
    }

    #[test]
    fn this_test_binary_is_dynamic() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(is_elf(&me));
        assert!(has_interp(&me[..4096.min(me.len())]));
        // An ELF64 header whose one program header is PT_LOAD: static.
        let mut h = vec![0u8; 0x40 + 0x38];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        h[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
        h[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        h[0x40..0x44].copy_from_slice(&1u32.to_le_bytes());
        assert!(!has_interp(&h));
    }
}
