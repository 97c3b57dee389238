//! PROXY protocol v1 (text) and v2 (binary) headers, as HAProxy and most
//! load balancers send them before the client's bytes. The header is read
//! exactly (never a byte of MQTT past it); the source address it carries
//! becomes the client's address for limits, throttling and logs.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The 12-byte signature starting a v2 header.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Longest v1 line, CRLF included (from the specification).
const V1_MAX: usize = 107;
/// Largest v2 address block accepted (TLVs included).
const V2_MAX: usize = 1024;

/// Why a header was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// Neither a v1 nor a v2 header.
    #[error("no PROXY protocol header")]
    Missing,
    /// A header that does not parse.
    #[error("invalid PROXY protocol header: {0}")]
    Invalid(&'static str),
    /// The connection ended or failed inside the header.
    #[error("connection lost in the PROXY header")]
    Io,
}

/// Read a v1 or v2 header from `s`. `Ok(Some(addr))`: the client's
/// address; `Ok(None)`: a LOCAL / UNKNOWN header (health check): keep the
/// socket's peer address.
pub async fn read_header<S: AsyncRead + Unpin>(
    s: &mut S,
) -> Result<Option<SocketAddr>, ProxyError> {
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.map_err(|_| ProxyError::Io)?;
    if head == V2_SIGNATURE {
        let mut fixed = [0u8; 4];
        s.read_exact(&mut fixed).await.map_err(|_| ProxyError::Io)?;
        let len = usize::from(u16::from_be_bytes([fixed[2], fixed[3]]));
        if len > V2_MAX {
            return Err(ProxyError::Invalid("v2 address block too long"));
        }
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).await.map_err(|_| ProxyError::Io)?;
        return parse_v2(fixed[0], fixed[1], &body);
    }
    if !head.starts_with(b"PROXY ") {
        return Err(ProxyError::Missing);
    }
    let mut line = head.to_vec();
    while !line.ends_with(b"\r\n") {
        if line.len() >= V1_MAX {
            return Err(ProxyError::Invalid("v1 line too long"));
        }
        let b = s.read_u8().await.map_err(|_| ProxyError::Io)?;
        line.push(b);
    }
    let text = std::str::from_utf8(&line[..line.len() - 2])
        .map_err(|_| ProxyError::Invalid("v1 line is not text"))?;
    parse_v1(text)
}

/// Parse a v1 line without its CRLF: `PROXY TCP4 SRC DST SPORT DPORT`,
/// `PROXY TCP6 ...` or `PROXY UNKNOWN ...`.
pub fn parse_v1(line: &str) -> Result<Option<SocketAddr>, ProxyError> {
    let mut parts = line.split(' ');
    if parts.next() != Some("PROXY") {
        return Err(ProxyError::Missing);
    }
    let family = parts.next().ok_or(ProxyError::Invalid("v1: no family"))?;
    match family {
        "UNKNOWN" => return Ok(None),
        "TCP4" | "TCP6" => {}
        _ => return Err(ProxyError::Invalid("v1: unknown family")),
    }
    let src: IpAddr = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or(ProxyError::Invalid("v1: bad source address"))?;
    let dst: IpAddr = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or(ProxyError::Invalid("v1: bad destination address"))?;
    let sport: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or(ProxyError::Invalid("v1: bad source port"))?;
    let _dport: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or(ProxyError::Invalid("v1: bad destination port"))?;
    if parts.next().is_some() {
        return Err(ProxyError::Invalid("v1: extra fields"));
    }
    let v4 = family == "TCP4";
    if src.is_ipv4() != v4 || dst.is_ipv4() != v4 {
        return Err(ProxyError::Invalid("v1: address does not match family"));
    }
    Ok(Some(SocketAddr::new(src, sport)))
}

/// Parse a v2 header after its signature: version/command byte, family
/// byte, address block.
pub fn parse_v2(ver_cmd: u8, family: u8, body: &[u8]) -> Result<Option<SocketAddr>, ProxyError> {
    if ver_cmd >> 4 != 2 {
        return Err(ProxyError::Invalid("v2: bad version"));
    }
    match ver_cmd & 0x0f {
        0 => return Ok(None), // LOCAL
        1 => {}
        _ => return Err(ProxyError::Invalid("v2: bad command")),
    }
    match family {
        // TCP over IPv4 / UDP over IPv4
        0x11 | 0x12 => {
            let b = body
                .get(..12)
                .ok_or(ProxyError::Invalid("v2: short IPv4 block"))?;
            let ip = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
            let port = u16::from_be_bytes([b[8], b[9]]);
            Ok(Some(SocketAddr::new(IpAddr::V4(ip), port)))
        }
        0x21 | 0x22 => {
            let b = body
                .get(..36)
                .ok_or(ProxyError::Invalid("v2: short IPv6 block"))?;
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&b[..16]);
            let port = u16::from_be_bytes([b[32], b[33]]);
            Ok(Some(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(octets)),
                port,
            )))
        }
        // UNSPEC, unix sockets: no usable address.
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_lines() {
        assert_eq!(
            parse_v1("PROXY TCP4 192.0.2.7 10.0.0.1 51000 1883").unwrap(),
            Some("192.0.2.7:51000".parse().unwrap())
        );
        assert_eq!(
            parse_v1("PROXY TCP6 2001:db8::1 ::1 4000 1883").unwrap(),
            Some("[2001:db8::1]:4000".parse().unwrap())
        );
        assert_eq!(parse_v1("PROXY UNKNOWN").unwrap(), None);
        assert!(parse_v1("PROXY TCP4 2001:db8::1 ::1 4000 1883").is_err());
        assert!(parse_v1("PROXY TCP4 1.2.3.4 5.6.7.8 99999 1").is_err());
        assert!(parse_v1("PROXY TCP4 1.2.3.4").is_err());
        assert!(parse_v1("GET / HTTP/1.1").is_err());
    }

    #[test]
    fn v2_blocks() {
        let mut b = vec![192, 0, 2, 9, 10, 0, 0, 1];
        b.extend_from_slice(&4242u16.to_be_bytes());
        b.extend_from_slice(&1883u16.to_be_bytes());
        assert_eq!(
            parse_v2(0x21, 0x11, &b).unwrap(),
            Some("192.0.2.9:4242".parse().unwrap())
        );
        assert_eq!(parse_v2(0x20, 0x11, &b).unwrap(), None);
        assert!(parse_v2(0x11, 0x11, &b).is_err());
        assert!(parse_v2(0x21, 0x11, &b[..5]).is_err());
        assert!(parse_v2(0x21, 0x21, &b).is_err());
    }

    #[test]
    fn reads_exactly_the_header() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let data = b"PROXY TCP4 192.0.2.7 10.0.0.1 51000 1883\r\n\x10rest".to_vec();
            let mut s = &data[..];
            let a = read_header(&mut s).await.unwrap();
            assert_eq!(a, Some("192.0.2.7:51000".parse().unwrap()));
            assert_eq!(s, b"\x10rest");
            let mut v2 = V2_SIGNATURE.to_vec();
            v2.extend_from_slice(&[
                0x21, 0x11, 0, 12, 1, 2, 3, 4, 5, 6, 7, 8, 0, 80, 0, 81, 0x10,
            ]);
            let mut s = &v2[..];
            let a = read_header(&mut s).await.unwrap();
            assert_eq!(a, Some("1.2.3.4:80".parse().unwrap()));
            assert_eq!(s, b"\x10");
            let mut s = &b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c"[..];
            assert_eq!(read_header(&mut s).await, Err(ProxyError::Missing));
        });
    }
}
