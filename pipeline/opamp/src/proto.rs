//! The OpAMP messages proflow sends and reads (opamp.proto of the OpAMP
//! specification, package `opamp.proto`), written from their field numbers
//! and types. Fields proflow does not use (packages, connection settings,
//! custom messages, commands) are left out: prost skips them when they
//! arrive.

use std::collections::HashMap;

/// `AgentToServer`: every message an agent sends.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AgentToServer {
    /// 16 bytes (a UUID).
    #[prost(bytes = "vec", tag = "1")]
    pub instance_uid: Vec<u8>,
    #[prost(uint64, tag = "2")]
    pub sequence_num: u64,
    #[prost(message, optional, tag = "3")]
    pub agent_description: Option<AgentDescription>,
    /// [`capabilities`] bits.
    #[prost(uint64, tag = "4")]
    pub capabilities: u64,
    #[prost(message, optional, tag = "5")]
    pub health: Option<ComponentHealth>,
    #[prost(message, optional, tag = "6")]
    pub effective_config: Option<EffectiveConfig>,
    #[prost(message, optional, tag = "7")]
    pub remote_config_status: Option<RemoteConfigStatus>,
    /// Sent (empty) as the last message before the agent disconnects.
    #[prost(message, optional, tag = "9")]
    pub agent_disconnect: Option<AgentDisconnect>,
    #[prost(uint64, tag = "10")]
    pub flags: u64,
}

/// `ServerToAgent`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerToAgent {
    #[prost(bytes = "vec", tag = "1")]
    pub instance_uid: Vec<u8>,
    #[prost(message, optional, tag = "2")]
    pub error_response: Option<ServerErrorResponse>,
    #[prost(message, optional, tag = "3")]
    pub remote_config: Option<AgentRemoteConfig>,
    /// [`server_flags`] bits.
    #[prost(uint64, tag = "6")]
    pub flags: u64,
    #[prost(uint64, tag = "7")]
    pub capabilities: u64,
    #[prost(message, optional, tag = "8")]
    pub agent_identification: Option<AgentIdentification>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AgentDisconnect {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerErrorResponse {
    /// 0 unknown, 1 bad request, 2 unavailable.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub error_message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AgentIdentification {
    #[prost(bytes = "vec", tag = "1")]
    pub new_instance_uid: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AgentRemoteConfig {
    #[prost(message, optional, tag = "1")]
    pub config: Option<AgentConfigMap>,
    #[prost(bytes = "vec", tag = "2")]
    pub config_hash: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AgentConfigMap {
    /// Config files by name (`""` when there is one).
    #[prost(map = "string, message", tag = "1")]
    pub config_map: HashMap<String, AgentConfigFile>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AgentConfigFile {
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
    #[prost(string, tag = "2")]
    pub content_type: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EffectiveConfig {
    #[prost(message, optional, tag = "1")]
    pub config_map: Option<AgentConfigMap>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemoteConfigStatus {
    #[prost(bytes = "vec", tag = "1")]
    pub last_remote_config_hash: Vec<u8>,
    /// [`remote_config_status`] values.
    #[prost(int32, tag = "2")]
    pub status: i32,
    #[prost(string, tag = "3")]
    pub error_message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AgentDescription {
    #[prost(message, repeated, tag = "1")]
    pub identifying_attributes: Vec<KeyValue>,
    #[prost(message, repeated, tag = "2")]
    pub non_identifying_attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ComponentHealth {
    #[prost(bool, tag = "1")]
    pub healthy: bool,
    #[prost(fixed64, tag = "2")]
    pub start_time_unix_nano: u64,
    #[prost(string, tag = "3")]
    pub last_error: String,
    #[prost(string, tag = "4")]
    pub status: String,
    #[prost(fixed64, tag = "5")]
    pub status_time_unix_nano: u64,
    #[prost(map = "string, message", tag = "6")]
    pub component_health_map: HashMap<String, ComponentHealth>,
}

/// `KeyValue` of OpAMP's anyvalue.proto (the same shape as OTLP's).
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3")]
    pub value: Option<any_value::Value>,
}

pub mod any_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        StringValue(String),
        #[prost(bool, tag = "2")]
        BoolValue(bool),
        #[prost(int64, tag = "3")]
        IntValue(i64),
    }
}

/// A string attribute.
pub fn attribute(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
    }
}

/// `AgentCapabilities` bits proflow sets.
pub mod capabilities {
    pub const REPORTS_STATUS: u64 = 0x1;
    pub const ACCEPTS_REMOTE_CONFIG: u64 = 0x2;
    pub const REPORTS_EFFECTIVE_CONFIG: u64 = 0x4;
    pub const REPORTS_HEALTH: u64 = 0x800;
    pub const REPORTS_REMOTE_CONFIG: u64 = 0x1000;
}

/// `ServerToAgentFlags`.
pub mod server_flags {
    pub const REPORT_FULL_STATE: u64 = 0x1;
}

/// `RemoteConfigStatuses`.
pub mod remote_config_status {
    pub const APPLIED: i32 = 1;
    pub const APPLYING: i32 = 2;
    pub const FAILED: i32 = 3;
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn field_numbers_are_the_specifications() {
        let msg = AgentToServer {
            instance_uid: vec![7; 16],
            sequence_num: 3,
            capabilities: capabilities::REPORTS_STATUS,
            flags: 0,
            ..Default::default()
        };
        // 1: bytes (tag 0x0a), 2: varint (0x10), 4: varint (0x20).
        let bytes = msg.encode_to_vec();
        assert_eq!(&bytes[..2], &[0x0a, 16]);
        assert_eq!(&bytes[18..], &[0x10, 3, 0x20, 1]);
        // A server's remote config: field 3, its map at 1, the hash at 2.
        let mut files = HashMap::new();
        files.insert(
            String::new(),
            AgentConfigFile {
                body: b"x".to_vec(),
                content_type: "text/yaml".into(),
            },
        );
        let server = ServerToAgent {
            remote_config: Some(AgentRemoteConfig {
                config: Some(AgentConfigMap { config_map: files }),
                config_hash: vec![9],
            }),
            ..Default::default()
        };
        let bytes = server.encode_to_vec();
        assert_eq!(bytes[0], 0x1a, "ServerToAgent.remote_config is field 3");
        assert_eq!(ServerToAgent::decode(bytes.as_slice()).unwrap(), server);
    }
}
