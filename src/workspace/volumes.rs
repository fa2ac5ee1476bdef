//! Volumes: named per-tenant filesystems that outlive sessions. A session created with
//! `volumeId` holds its volume read-write (one holder at a time, recorded in LMDB with
//! the session) and every step gets it at `/memory`. Like a workspace, a volume is an
//! ext4 image (`<data>/volumes/<id>/vol.img`, quota enforced by the kernel), mounted
//! only while a step of its holder runs or soon after.

use super::{image, now_ms, valid_id, Live, SessionError, Sessions, BYTES_PER_INODE};
use crate::store::volumes::VolumeRecord;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// Image file name inside a volume directory.
const IMAGE: &str = "vol.img";
/// Mount point name inside a volume directory.
const MOUNT: &str = "mnt";
/// Longest volume name (bytes).
pub const MAX_VOLUME_NAME_BYTES: usize = 128;

impl Sessions {
    fn vol_dir(&self, id: &str) -> PathBuf {
        self.vol_root.join(id)
    }

    /// Mounts volume `vid` (a step of its holder is starting). Returns the mount point.
    pub(super) fn mount_volume(&self, vid: &str) -> Result<PathBuf, SessionError> {
        let dir = self.vol_dir(vid);
        let mnt = dir.join(MOUNT);
        // Never two live mounts of one image: a previous holder's detached mount may
        // outlive it for a moment (until its last gVisor process is gone).
        if image_attached(&dir.join(IMAGE)) {
            return Err(SessionError::VolumeBusy);
        }
        image::mount(&dir.join(IMAGE), &mnt).map_err(|e| {
            log::error!("volume {vid}: mount: {e}");
            SessionError::Workspace("the session's volume could not be mounted".into())
        })?;
        Ok(mnt)
    }

    /// Unmounts the volume session `id` has mounted, if any (`lazy` at shutdown and
    /// delete, where a busy mount must still go).
    pub(super) fn unmount_volume_of(&self, id: &str, live: &Live, lazy: bool) {
        let mut vol = live.volume.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mnt) = vol.as_ref() else { return };
        if !lazy {
            let _ = image::trim(mnt);
        }
        let r = if lazy {
            image::unmount_lazy(mnt)
        } else {
            image::unmount(mnt)
        };
        match r {
            Ok(()) => *vol = None,
            Err(e) => log::warn!("session {id}: volume unmount: {e}"),
        }
    }

    /// Startup: unmount leftovers, remove directories without a record, drop records
    /// whose image vanished.
    pub(super) fn sweep_volumes(&self) -> Result<(), SessionError> {
        for m in image::mounts_under(&self.vol_root) {
            log::warn!("sweep: unmounting leftover {}", m.display());
            if let Err(e) = image::unmount_lazy(&m) {
                log::error!("sweep: unmount {}: {e}", m.display());
            }
        }
        let records: std::collections::HashMap<String, VolumeRecord> =
            self.store.volumes()?.into_iter().collect();
        if let Ok(rd) = std::fs::read_dir(&self.vol_root) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let ours = valid_id(&name) || name.strip_suffix(".partial").is_some_and(valid_id);
                if ours && !records.contains_key(&name) {
                    log::warn!("sweep: removing volume {name} with no record");
                    remove_volume_dir(&e.path());
                }
            }
        }
        for id in records.keys() {
            // Only an image that is not there drops its volume: any other error may
            // pass, and the data is kept for it.
            let missing = match std::fs::symlink_metadata(self.vol_dir(id).join(IMAGE)) {
                Ok(_) => false,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                Err(e) => {
                    log::error!("volume {id}: image cannot be read ({e}); kept");
                    false
                }
            };
            if missing {
                log::error!("volume {id}: image missing; the volume is dropped");
                if self.store.delete_volume(id)? == Some(false) {
                    log::error!("volume {id}: held by a session; kept, its steps will fail");
                }
            }
        }
        Ok(())
    }

    /// Disk really used by all volume images.
    pub(super) fn volumes_allocated(&self) -> u64 {
        let Ok(rd) = std::fs::read_dir(&self.vol_root) else {
            return 0;
        };
        rd.flatten()
            .map(|e| image::allocated_bytes(&e.path().join(IMAGE)).unwrap_or(0))
            .sum()
    }

    /// Creates a volume: image first, record last (a crash in between leaves a
    /// directory the sweep removes).
    ///
    /// # Errors
    /// [`SessionError::TooManyVolumes`], [`SessionError::StorageFull`] or a failure.
    pub fn create_volume(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<(String, VolumeRecord), SessionError> {
        let _g = self.create_guard()?;
        let all = self.store.volumes()?;
        if all.len() >= self.cfg.max_volumes {
            return Err(SessionError::TooManyVolumes);
        }
        if all.iter().filter(|(_, r)| r.tenant == tenant).count() >= self.cfg.max_volumes_per_tenant
        {
            return Err(SessionError::TooManyVolumesForTenant(
                self.cfg.max_volumes_per_tenant,
            ));
        }
        let quota = self.cfg.volume_quota_bytes;
        let used = self.storage_used.load(Ordering::Relaxed);
        if used >= self.cfg.storage_max_bytes {
            return Err(SessionError::StorageFull(format!(
                "workspaces and volumes use {used} bytes, the ceiling is {}",
                self.cfg.storage_max_bytes
            )));
        }
        let free = image::free_bytes(&self.vol_root)
            .map_err(|e| SessionError::Workspace(e.to_string()))?;
        if free < self.cfg.storage_reserve_bytes.saturating_add(quota) {
            return Err(SessionError::StorageFull(
                "not enough free disk for another volume".into(),
            ));
        }
        let id: String = self
            .random(16)?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let partial = self.vol_root.join(format!("{id}.partial"));
        let dir = self.vol_dir(&id);
        let made = (|| -> Result<u64, String> {
            std::fs::create_dir(&partial).map_err(|e| e.to_string())?;
            image::create(
                &partial.join(IMAGE),
                quota,
                (quota / BYTES_PER_INODE).max(1024),
            )
            .map_err(|e| e.to_string())?;
            std::fs::create_dir(partial.join(MOUNT)).map_err(|e| e.to_string())?;
            std::fs::rename(&partial, &dir).map_err(|e| e.to_string())?;
            super::sync_dir(&self.vol_root).map_err(|e| e.to_string())?;
            image::allocated_bytes(&dir.join(IMAGE)).map_err(|e| e.to_string())
        })();
        let allocated = match made {
            Ok(a) => a,
            Err(e) => {
                remove_volume_dir(&partial);
                remove_volume_dir(&dir);
                log::error!("volume {id}: creating: {e}");
                return Err(SessionError::Workspace(
                    "the volume could not be created; see the daemon log".into(),
                ));
            }
        };
        let rec = VolumeRecord {
            tenant: tenant.to_string(),
            name: name.to_string(),
            created_at_ms: now_ms(),
            quota_bytes: quota,
            held_by: None,
        };
        if !self.store.insert_volume(&id, &rec)? {
            remove_volume_dir(&dir);
            return Err(SessionError::Workspace("volume id collision".into()));
        }
        self.storage_used.fetch_add(allocated, Ordering::Relaxed);
        Ok((id, rec))
    }

    /// One of `tenant`'s volumes (another tenant's is "not found").
    ///
    /// # Errors
    /// [`SessionError::VolumeNotFound`].
    pub fn volume(&self, tenant: &str, id: &str) -> Result<VolumeRecord, SessionError> {
        if !valid_id(id) {
            return Err(SessionError::VolumeNotFound);
        }
        match self.store.volume(id)? {
            Some(v) if v.tenant == tenant => Ok(v),
            _ => Err(SessionError::VolumeNotFound),
        }
    }

    /// `tenant`'s volumes, oldest first.
    ///
    /// # Errors
    /// [`SessionError::Store`].
    pub fn list_volumes(&self, tenant: &str) -> Result<Vec<(String, VolumeRecord)>, SessionError> {
        let mut v: Vec<_> = self
            .store
            .volumes()?
            .into_iter()
            .filter(|(_, r)| r.tenant == tenant)
            .collect();
        v.sort_by(|a, b| (a.1.created_at_ms, &a.0).cmp(&(b.1.created_at_ms, &b.0)));
        Ok(v)
    }

    /// Bytes a volume's files use (from its image's filesystem when mounted, else the
    /// image's allocation, an upper bound).
    pub fn volume_used_bytes(&self, id: &str) -> u64 {
        let mnt = self.vol_dir(id).join(MOUNT);
        if image::is_mounted(&mnt) {
            if let Ok(u) = image::usage(&mnt) {
                return u.used_bytes;
            }
        }
        image::allocated_bytes(&self.vol_dir(id).join(IMAGE)).unwrap_or(0)
    }

    /// Deletes a volume that no session holds.
    ///
    /// # Errors
    /// [`SessionError::VolumeNotFound`] or [`SessionError::VolumeBusy`].
    pub fn delete_volume(&self, tenant: &str, id: &str) -> Result<(), SessionError> {
        self.volume(tenant, id)?;
        match self.store.delete_volume(id)? {
            None => return Err(SessionError::VolumeNotFound),
            Some(false) => return Err(SessionError::VolumeBusy),
            Some(true) => {}
        }
        let dir = self.vol_dir(id);
        let freed = image::allocated_bytes(&dir.join(IMAGE)).unwrap_or(0);
        remove_volume_dir(&dir);
        let _ = self
            .storage_used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(freed))
            });
        log::info!("volume {id} deleted");
        Ok(())
    }
}

/// Whether some loop device is still backed by `img`.
fn image_attached(img: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir("/sys/block") else {
        return false;
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .any(|b| Path::new(b.trim_end()) == img)
}

fn remove_volume_dir(dir: &Path) {
    if !dir.exists() {
        return;
    }
    let _ = image::unmount_lazy(&dir.join(MOUNT));
    let _ = std::fs::remove_file(dir.join(IMAGE));
    let _ = std::fs::remove_dir(dir.join(MOUNT));
    if let Err(e) = std::fs::remove_dir(dir) {
        log::error!("removing {}: {e}", dir.display());
    }
}
