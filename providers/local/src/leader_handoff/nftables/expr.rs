//! The expressions of an nf_tables rule ([`Expr`]), and the attributes that write each of them.

use super::{encode::Attrs, uapi::*};

/// One expression of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Expr {
    /// `meta load KEY => reg`.
    Meta { key: u32, dreg: u32 },
    /// `cmp eq reg DATA`.
    Cmp { sreg: u32, data: Vec<u8> },
    /// `payload load LEN @ BASE + OFFSET => reg`.
    Load {
        base: u32,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    /// `payload write reg => LEN @ BASE + OFFSET`, with `csum_flags` (0: no checksum to update;
    /// [`NFT_PAYLOAD_L4CSUM_PSEUDOHDR`]: the transport checksum follows an address written).
    Write {
        base: u32,
        offset: u32,
        len: u32,
        sreg: u32,
        csum_flags: u32,
    },
    /// `bitwise reg = (reg & MASK) ^ XOR`.
    Bitwise {
        reg: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// `lookup reg set SET`.
    Lookup { set: &'static str, set_id: u32 },
    /// `dynset OP reg_key 1 set SET`.
    Dynset {
        op: u32,
        set: &'static str,
        set_id: u32,
    },
    /// `immediate reg DATA`.
    Immediate { dreg: u32, data: Vec<u8> },
    /// `immediate reg 0 VERDICT`.
    Verdict(u32),
    /// `fwd sreg_dev reg`.
    Fwd { sreg_dev: u32 },
}

impl Expr {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Expr::Meta { .. } => "meta",
            Expr::Cmp { .. } => "cmp",
            Expr::Load { .. } | Expr::Write { .. } => "payload",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Lookup { .. } => "lookup",
            Expr::Dynset { .. } => "dynset",
            Expr::Immediate { .. } | Expr::Verdict(_) => "immediate",
            Expr::Fwd { .. } => "fwd",
        }
    }
}

impl Attrs<'_> {
    /// An expression's attributes (its `NFTA_EXPR_DATA`).
    pub(super) fn expr(&mut self, expr: &Expr) {
        match expr {
            Expr::Meta { key, dreg } => {
                self.u32(NFTA_META_KEY, *key);
                self.u32(NFTA_META_DREG, *dreg);
            }
            Expr::Cmp { sreg, data } => {
                self.u32(NFTA_CMP_SREG, *sreg);
                self.u32(NFTA_CMP_OP, NFT_CMP_EQ);
                self.data(NFTA_CMP_DATA, data);
            }
            Expr::Load {
                base,
                offset,
                len,
                dreg,
            } => {
                self.u32(NFTA_PAYLOAD_DREG, *dreg);
                self.payload_at(*base, *offset, *len);
            }
            Expr::Write {
                base,
                offset,
                len,
                sreg,
                csum_flags,
            } => {
                self.u32(NFTA_PAYLOAD_SREG, *sreg);
                self.payload_at(*base, *offset, *len);
                if *csum_flags != 0 {
                    self.u32(NFTA_PAYLOAD_CSUM_FLAGS, *csum_flags);
                }
            }
            Expr::Bitwise { reg, mask, xor } => {
                self.u32(NFTA_BITWISE_SREG, *reg);
                self.u32(NFTA_BITWISE_DREG, *reg);
                self.u32(NFTA_BITWISE_OP, NFT_BITWISE_BOOL);
                self.u32(
                    NFTA_BITWISE_LEN,
                    u32::try_from(mask.len()).unwrap_or(u32::MAX),
                );
                self.data(NFTA_BITWISE_MASK, mask);
                self.data(NFTA_BITWISE_XOR, xor);
            }
            Expr::Lookup { set, set_id } => {
                self.u32(NFTA_LOOKUP_SREG, NFT_REG_1);
                self.string(NFTA_LOOKUP_SET, set);
                self.u32(NFTA_LOOKUP_SET_ID, *set_id);
            }
            Expr::Dynset { op, set, set_id } => {
                self.u32(NFTA_DYNSET_SREG_KEY, NFT_REG_1);
                self.u32(NFTA_DYNSET_OP, *op);
                self.string(NFTA_DYNSET_SET_NAME, set);
                self.u32(NFTA_DYNSET_SET_ID, *set_id);
            }
            Expr::Immediate { dreg, data } => {
                self.u32(NFTA_IMMEDIATE_DREG, *dreg);
                self.data(NFTA_IMMEDIATE_DATA, data);
            }
            Expr::Verdict(code) => {
                self.u32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
                self.nested(NFTA_IMMEDIATE_DATA, |attrs| {
                    attrs.nested(NFTA_DATA_VERDICT, |attrs| {
                        attrs.u32(NFTA_VERDICT_CODE, *code);
                    });
                });
            }
            Expr::Fwd { sreg_dev } => self.u32(NFTA_FWD_SREG_DEV, *sreg_dev),
        }
    }

    /// A payload expression's place: its base, offset and length.
    fn payload_at(&mut self, base: u32, offset: u32, len: u32) {
        self.u32(NFTA_PAYLOAD_BASE, base);
        self.u32(NFTA_PAYLOAD_OFFSET, offset);
        self.u32(NFTA_PAYLOAD_LEN, len);
    }
}
