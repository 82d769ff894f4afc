//! Placeholder replaced by the helper.
