//! The batch that removes a table ([`delete_table_batch`]).

use super::{
    Batch, Family, NftError,
    encode::{Builder, check_name},
    uapi::NFT_NAME_MAX,
};

/// The batch that removes the table `table` of `family`, whether or not it is there.
pub(crate) fn delete_table_batch(family: Family, table: &str) -> Result<Batch, NftError> {
    check_name("table", table, NFT_NAME_MAX)?;
    let mut batch = Builder::new();
    batch.replace_table(family, table, false);
    batch.finish()
}
