//! `sys.device.list|get|update` (reference `sys/device.test.ts`): devices
//! the caller can see through ownership or a group in its ACL.

use gsv_protocol::device::{DeviceResult, GetArgs, ListArgs, ListResult, UpdateArgs};
use std::sync::Arc;

use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::routing;
use crate::session::Session;

/// Visible devices; online ones only unless `includeOffline`.
pub async fn list(k: Arc<Kernel>, s: Arc<Session>, a: ListArgs) -> Result<ListResult, KernelError> {
    let who = s.identity.clone();
    let mut devices = k.db.call(move |c| routing::list_devices(c, &who)).await?;
    if !a.include_offline {
        devices.retain(|d| d.online);
    }
    Ok(ListResult { devices })
}

/// One device, or `device: null` when the caller cannot see it.
pub async fn get(k: Arc<Kernel>, s: Arc<Session>, a: GetArgs) -> Result<DeviceResult, KernelError> {
    let who = s.identity.clone();
    let device =
        k.db.call(
            move |c| match routing::visible_device(c, &a.device_id, &who) {
                Ok(d) => Ok(Some(d)),
                Err(KernelError::AccessDenied { .. }) => Ok(None),
                Err(e) => Err(e),
            },
        )
        .await?;
    Ok(DeviceResult { device })
}

/// Changes label and description; only the owner (or root) may.
pub async fn update(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: UpdateArgs,
) -> Result<DeviceResult, KernelError> {
    let who = s.identity.clone();
    let device =
        k.db.call(move |c| {
            let d = routing::visible_device(c, &a.device_id, &who)?;
            if !who.is_root() && d.owner_uid != who.uid {
                return Err(KernelError::AccessDenied {
                    kind: "device",
                    id: a.device_id,
                });
            }
            routing::update_device(
                c,
                &d.device_id,
                a.label.as_deref(),
                a.description.as_deref(),
            )?;
            routing::get_device(c, &d.device_id)
        })
        .await?;
    Ok(DeviceResult { device })
}
