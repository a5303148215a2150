//! `google.rpc.Status` and `google.rpc.RetryInfo`, the error messages OTLP
//! speaks: gRPC carries a `Status` in `grpc-status-details-bin`, OTLP/HTTP
//! sends one as the body of an error response (protobuf or JSON, as the
//! request was). Written here from their field numbers; nothing else of
//! the `google.rpc` protos is needed.

use std::time::Duration;

use prost::Message;

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<ProtoAny>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ProtoAny {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ProtoDuration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

pub(crate) const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

impl RpcStatus {
    /// A status with a `RetryInfo` detail when `retry_after` is set.
    pub fn new(code: i32, message: String, retry_after: Option<Duration>) -> Self {
        let details = retry_after
            .map(|d| ProtoAny {
                type_url: RETRY_INFO_TYPE_URL.to_owned(),
                value: RetryInfo {
                    retry_delay: Some(ProtoDuration {
                        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
                    }),
                }
                .encode_to_vec(),
            })
            .into_iter()
            .collect();
        RpcStatus {
            code,
            message,
            details,
        }
    }

    /// The JSON form (protobuf's JSON mapping: `Any` with `@type`, a
    /// duration as `"1.5s"`).
    pub fn to_json(&self) -> Vec<u8> {
        let details: Vec<serde_json::Value> = self
            .details
            .iter()
            .filter_map(|any| {
                let info = RetryInfo::decode(any.value.as_slice()).ok()?;
                let d = info.retry_delay.unwrap_or_default();
                let delay = if d.nanos == 0 {
                    format!("{}s", d.seconds)
                } else {
                    format!("{}.{:09}s", d.seconds, d.nanos)
                };
                Some(serde_json::json!({"@type": any.type_url, "retryDelay": delay}))
            })
            .collect();
        let mut body = serde_json::json!({"code": self.code, "message": self.message});
        if !details.is_empty() {
            body["details"] = serde_json::Value::Array(details);
        }
        body.to_string().into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_info_is_packed_as_the_spec_numbers_it() {
        let s = RpcStatus::new(8, "busy".into(), Some(Duration::new(1, 2)));
        let bytes = s.encode_to_vec();
        // Status{code=1: 8, message=2: "busy", details=3: Any{type_url=1, value=2:
        // RetryInfo{retry_delay=1: Duration{seconds=1: 1, nanos=2: 2}}}}
        let mut expected = vec![0x08, 8, 0x12, 4];
        expected.extend_from_slice(b"busy");
        let retry = [0x0a, 4, 0x08, 1, 0x10, 2];
        let mut any = vec![0x0a, RETRY_INFO_TYPE_URL.len() as u8];
        any.extend_from_slice(RETRY_INFO_TYPE_URL.as_bytes());
        any.extend_from_slice(&[0x12, retry.len() as u8]);
        any.extend_from_slice(&retry);
        expected.extend_from_slice(&[0x1a, any.len() as u8]);
        expected.extend_from_slice(&any);
        assert_eq!(bytes, expected);
        let json: serde_json::Value = serde_json::from_slice(&s.to_json()).unwrap();
        assert_eq!(json["code"], 8);
        assert_eq!(json["details"][0]["retryDelay"], "1.000000002s");
    }
}
