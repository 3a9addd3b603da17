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

/// Checks a set of members against an array of `array_size` bytes: every range lies past the
/// array, none overlaps another, and none wraps. The end of the address space.
pub fn check_members(members: &[MemberConfig], array_size: u64) -> Result<u64, String> {
    let mut sorted: Vec<&MemberConfig> = members.iter().collect();
    sorted.sort_by_key(|m| m.start);
    let mut end = array_size;
    for m in sorted {
        if m.start.checked_add(m.len).is_none() {
            return Err(format!("member {}: its range wraps", m.uri));
        }
        if m.start < end {
            return Err(format!(
                "member {} at {:#x}: the range overlaps {} (which ends at {end:#x}); a member's \
                 range lies past the array and past the other members'",
                m.uri,
                m.start,
                if end == array_size {
                    "the local array"
                } else {
                    "another member's range"
                }
            ));
        }
        end = m.end();
    }
    Ok(end)
}

/// Where a range of the address space lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// In the local array.
    Local,
    /// Wholly in member `.0`'s range, at address `.1` there.
    Member(usize, u64),
    /// Not wholly in the array nor wholly in one member's range.
    Nowhere,
}

/// Where `[addr, addr + len)` lies.
pub fn locate(members: &[MemberConfig], array_size: u64, addr: u64, len: u64) -> Place {
    let Some(end) = addr.checked_add(len) else {
        return Place::Nowhere;
    };
    if end <= array_size {
        return Place::Local;
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
    fn ranges_lie_past_the_array_and_apart() {
        assert_eq!(
            check_members(&[member(100, 50), member(150, 10)], 100),
            Ok(160)
        );
        assert!(check_members(&[member(99, 50)], 100).is_err());
        assert!(check_members(&[member(100, 50), member(149, 10)], 100).is_err());
        assert!(check_members(&[member(u64::MAX - 1, 10)], 100).is_err());
        assert_eq!(check_members(&[], 100), Ok(100));
    }

    #[test]
    fn a_range_is_local_remote_or_refused() {
        let ms = [member(100, 50), member(200, 10)];
        assert_eq!(locate(&ms, 100, 0, 100), Place::Local);
        assert_eq!(locate(&ms, 100, 120, 30), Place::Member(0, 20));
        assert_eq!(locate(&ms, 100, 205, 5), Place::Member(1, 5));
        // Straddling the array and a member, two members, or a gap.
        assert_eq!(locate(&ms, 100, 90, 20), Place::Nowhere);
        assert_eq!(locate(&ms, 100, 140, 70), Place::Nowhere);
        assert_eq!(locate(&ms, 100, 160, 10), Place::Nowhere);
        assert_eq!(locate(&ms, 100, u64::MAX, 2), Place::Nowhere);
    }
}
