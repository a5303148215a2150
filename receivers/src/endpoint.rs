//! Listen addresses as receivers' configs write them. Shared by every
//! receiver that listens; depends on nothing but `std`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Parses `ip:port`, also accepting `localhost:port`. Host names are not
/// resolved: resolution at validation time would make configs depend on DNS.
pub(crate) fn parse_endpoint(endpoint: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = endpoint.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Some(port) = endpoint.strip_prefix("localhost:")
        && let Ok(port) = port.parse::<u16>()
    {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    Err(format!(
        "invalid endpoint {endpoint:?}: write an IP address and port such as 0.0.0.0:4040, 127.0.0.1:4040 or [::]:4040"
    ))
}
