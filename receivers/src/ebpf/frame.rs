//! One frame of a user stack as unwound, shared by the native unwinder
//! (`collector`) and the CPython walker (`python`), which merges the two.

/// One frame as unwound: its address and whether it is a return address
/// (whose call instruction is the byte before).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub addr: u64,
    pub is_return: bool,
}

impl Frame {
    /// The address to symbolize: inside the call instruction for return
    /// addresses, so the line is the call's.
    pub fn lookup(self) -> u64 {
        if self.is_return {
            self.addr.saturating_sub(1)
        } else {
            self.addr
        }
    }
}
