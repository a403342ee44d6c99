//! `sys.device.list|get|update` (reference `sys/device.test.ts`): devices
//! the caller can see through ownership or a group in its ACL.

use gsv_protocol::device::{DeviceResult, GetArgs, ListArgs, ListResult, UpdateArgs};
use std::sync::Arc;

use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

/// Visible devices; online ones only unless `includeOffline`.
pub async fn list(k: Arc<Kernel>, s: Arc<Session>, a: ListArgs) -> Result<ListResult, KernelError> {
    let mut devices = k.devices.list(&s.identity).await?;
    if !a.include_offline {
        devices.retain(|d| d.online);
    }
    Ok(ListResult { devices })
}

/// One device, or `device: null` when the caller cannot see it.
pub async fn get(k: Arc<Kernel>, s: Arc<Session>, a: GetArgs) -> Result<DeviceResult, KernelError> {
    let device = match k.devices.visible(&a.device_id, &s.identity).await {
        Ok(d) => Some(d),
        Err(KernelError::AccessDenied { .. }) => None,
        Err(e) => return Err(e),
    };
    Ok(DeviceResult { device })
}

/// Changes label and description; only the owner (or root) may.
pub async fn update(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: UpdateArgs,
) -> Result<DeviceResult, KernelError> {
    let device = k
        .devices
        .update(&a.device_id, &s.identity, a.label, a.description)
        .await?;
    Ok(DeviceResult { device })
}
