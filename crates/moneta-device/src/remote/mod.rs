//! Other members: ranges of the address space held by Moneta devices on other hosts (the three
//! Rs article, "Distributed storage"). A command whose range a member holds is checked against
//! this device's permission table as any other, then forwarded over that member's link, an NBD
//! connection ([`nbd`]) to the member's export, and completed through the same channel, tag and
//! completion strategy when the member answers.

pub mod link;
pub mod nbd;

use std::time::Duration;

pub use link::{Link, LinkState, LinkStats};

/// One member's part of the address space, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberConfig {
    /// First address of the range it holds.
    pub start: u64,
    /// Bytes it holds: the range is `[start, start + len)` here and `[0, len)` at the member.
    pub len: u64,
    /// Where its export is: an NBD URI (`nbds://host:port/?tls-psk-file=FILE` for a link
    /// authenticated by a pre-shared key, `nbd+unix:///?socket=PATH` on one host).
    pub uri: String,
    /// How long a forwarded request may go unanswered before the link is declared failed.
    pub timeout: Duration,
}

/// How long a forwarded request waits for its member's answer unless configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

impl MemberConfig {
    /// The end of its range.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }

    /// Parses `START:LEN=URI` (sizes with K/M/G/T suffixes).
    pub fn parse(
        s: &str,
        parse_size: impl Fn(&str) -> Result<u64, String>,
    ) -> Result<Self, String> {
        let (range, uri) = s
            .split_once('=')
            .ok_or_else(|| format!("a member is START:LEN=URI, not {s:?}"))?;
        let (start, len) = range
            .split_once(':')
            .ok_or_else(|| format!("a member's range is START:LEN, not {range:?}"))?;
        let m = MemberConfig {
            start: parse_size(start.trim())?,
            len: parse_size(len.trim())?,
            uri: uri.trim().to_string(),
            timeout: DEFAULT_TIMEOUT,
        };
        if m.len == 0 {
            return Err(format!("member {s:?}: its range is empty"));
        }
        if m.uri.is_empty() {
            return Err(format!("member {s:?}: no URI"));
        }
        Ok(m)
    }
}

/// Checks a set of members against the local array, which lies at `[local_at, local_at +
/// array_size)` of the address space: no range overlaps the array or another member's, and none
/// wraps. Returns the end of the address space.
pub fn check_members(
    members: &[MemberConfig],
    local_at: u64,
    array_size: u64,
) -> Result<u64, String> {
    let local_end = local_at
        .checked_add(array_size)
        .ok_or_else(|| format!("the local array at {local_at:#x} wraps the address space"))?;
    // Every range, the array's as `None`, by start.
    let mut ranges: Vec<(u64, u64, Option<&MemberConfig>)> = members
        .iter()
        .map(|m| {
            m.start
                .checked_add(m.len)
                .map(|end| (m.start, end, Some(m)))
                .ok_or_else(|| format!("member {}: its range wraps", m.uri))
        })
        .collect::<Result<_, _>>()?;
    ranges.push((local_at, local_end, None));
    ranges.sort_by_key(|&(start, _, m)| (start, m.is_some()));
    let name = |m: Option<&MemberConfig>| match m {
        Some(m) => format!("member {} at {:#x}", m.uri, m.start),
        None => format!("the local array at {local_at:#x}"),
    };
    for w in ranges.windows(2) {
        let ((_, end, a), (start, _, b)) = (w[0], w[1]);
        if start < end {
            return Err(format!(
                "{}: the range overlaps {} (which ends at {end:#x}); the local array and the \
                 members' ranges lie apart",
                name(b),
                name(a)
            ));
        }
    }
    Ok(ranges
        .iter()
        .map(|&(_, end, _)| end)
        .max()
        .unwrap_or(local_end))
}

/// Where a range of the address space lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// In the local array, at array address `.0`.
    Local(u64),
    /// Wholly in member `.0`'s range, at address `.1` there.
    Member(usize, u64),
    /// Not wholly in the array nor wholly in one member's range.
    Nowhere,
}

/// Where `[addr, addr + len)` lies, with the local array at `[local_at, local_at + array_size)`.
pub fn locate(
    members: &[MemberConfig],
    local_at: u64,
    array_size: u64,
    addr: u64,
    len: u64,
) -> Place {
    let Some(end) = addr.checked_add(len) else {
        return Place::Nowhere;
    };
    if addr >= local_at && end - local_at <= array_size {
        return Place::Local(addr - local_at);
    }
    members
        .iter()
        .position(|m| addr >= m.start && end <= m.end())
        .map_or(Place::Nowhere, |i| {
            Place::Member(i, addr - members[i].start)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(s: &str) -> Result<u64, String> {
        let (n, m) = match s.strip_suffix('M') {
            Some(n) => (n, 1 << 20),
            None => (s, 1),
        };
        n.parse::<u64>().map(|v| v * m).map_err(|e| e.to_string())
    }

    fn member(start: u64, len: u64) -> MemberConfig {
        MemberConfig {
            start,
            len,
            uri: format!("nbd://h/{start}"),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    #[test]
    fn parse() {
        let m = MemberConfig::parse("64M:32M=nbds://10.0.0.2/?tls-psk-file=/k", size).unwrap();
        assert_eq!((m.start, m.len), (64 << 20, 32 << 20));
        assert_eq!(m.uri, "nbds://10.0.0.2/?tls-psk-file=/k");
        assert!(MemberConfig::parse("64M=nbd://h", size).is_err());
        assert!(MemberConfig::parse("64M:32M", size).is_err());
        assert!(MemberConfig::parse("64M:0=nbd://h", size).is_err());
        assert!(MemberConfig::parse("64M:1M=", size).is_err());
    }

    #[test]
    fn ranges_lie_apart_from_the_array_and_each_other() {
        assert_eq!(
            check_members(&[member(100, 50), member(150, 10)], 0, 100),
            Ok(160)
        );
        assert!(check_members(&[member(99, 50)], 0, 100).is_err());
        assert!(check_members(&[member(100, 50), member(149, 10)], 0, 100).is_err());
        assert!(check_members(&[member(u64::MAX - 1, 10)], 0, 100).is_err());
        assert_eq!(check_members(&[], 0, 100), Ok(100));
        // The array after a member, between two, and overlapping one.
        assert_eq!(check_members(&[member(0, 100)], 100, 100), Ok(200));
        assert_eq!(
            check_members(&[member(0, 100), member(300, 50)], 100, 200),
            Ok(350)
        );
        assert!(check_members(&[member(0, 101)], 100, 100).is_err());
        assert!(check_members(&[member(150, 10)], 100, 100).is_err());
        assert!(check_members(&[], u64::MAX - 10, 100).is_err());
    }

    #[test]
    fn a_range_is_local_remote_or_refused() {
        let ms = [member(100, 50), member(200, 10)];
        assert_eq!(locate(&ms, 0, 100, 0, 100), Place::Local(0));
        assert_eq!(locate(&ms, 0, 100, 120, 30), Place::Member(0, 20));
        assert_eq!(locate(&ms, 0, 100, 205, 5), Place::Member(1, 5));
        // Straddling the array and a member, two members, or a gap.
        assert_eq!(locate(&ms, 0, 100, 90, 20), Place::Nowhere);
        assert_eq!(locate(&ms, 0, 100, 140, 70), Place::Nowhere);
        assert_eq!(locate(&ms, 0, 100, 160, 10), Place::Nowhere);
        assert_eq!(locate(&ms, 0, 100, u64::MAX, 2), Place::Nowhere);
        // The array after the members: its addresses start at its place.
        let ms = [member(0, 100)];
        assert_eq!(locate(&ms, 100, 50, 0, 100), Place::Member(0, 0));
        assert_eq!(locate(&ms, 100, 50, 120, 30), Place::Local(20));
        assert_eq!(locate(&ms, 100, 50, 90, 20), Place::Nowhere);
        assert_eq!(locate(&ms, 100, 50, 140, 20), Place::Nowhere);
    }
}
