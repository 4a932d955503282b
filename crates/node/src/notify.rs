//! The binding of notifications (`ferry_core::notify`): sending one with a transfer, a
//! submission or alone, and taking the ones that arrived. Converts, decides nothing.

use ferry_core::notify::InboxSignal;
use ferry_core::NotifyOutcome;
use napi::bindgen_prelude::{Buffer, Function, Object};
use napi::Env;
use napi_derive::napi;

use crate::convert::{internal, js_error, requests, FailureJs, TaskStatusJs, TransferRequest};
use crate::js::to_u64;
use crate::settle::Settle;
use crate::NativeEngine;

/// A notification that arrived.
#[napi(object)]
pub struct NotificationJs {
    /// The sender's segment name.
    pub from: String,
    /// The sender's engine id (decimal).
    pub engine_id: String,
    /// The payload.
    pub data: Buffer,
    /// Bytes of the transfer it rode on (0 for `notify`).
    pub bytes: f64,
}

/// What the receive queue signals: "ready" (notifications wait) or "dropped" (the queue
/// was full; `from` and `total` set).
#[napi(object)]
pub struct NotifySignalJs {
    /// "ready" or "dropped".
    pub kind: String,
    /// The sender whose notification was dropped.
    pub from: Option<String>,
    /// Notifications dropped by this engine so far.
    pub total: Option<f64>,
}

/// The outcome of a notification: "queued" or "dropped" by the target, or an error.
#[napi(object)]
#[derive(Default)]
pub struct NotifyResult {
    /// "queued" or "dropped"; absent on error.
    pub outcome: Option<String>,
    /// Why it was not delivered.
    pub error: Option<FailureJs>,
}

impl NotifyResult {
    fn of(r: ferry_core::Result<NotifyOutcome>) -> Self {
        match r {
            Ok(o) => Self {
                outcome: Some(outcome_name(o).into()),
                ..Self::default()
            },
            Err(e) => Self::error(&e),
        }
    }

    pub(crate) fn error(e: &ferry_core::Error) -> Self {
        Self {
            outcome: None,
            error: Some(FailureJs::from(e)),
        }
    }
}

fn outcome_name(o: NotifyOutcome) -> &'static str {
    match o {
        NotifyOutcome::Dropped => "dropped",
        NotifyOutcome::Queued => "queued",
    }
}

/// A transfer's statuses and, when its notification was not delivered, why.
#[napi(object)]
#[derive(Default)]
pub struct NotifiedTransfer {
    /// Every task's final status.
    pub tasks: Vec<TaskStatusJs>,
    /// Set when the data landed but the notification was not delivered.
    pub notify_error: Option<NotifyResult>,
}

#[napi]
impl NativeEngine {
    /// `transfer` with a notification sent once every task completed; returns `{ op,
    /// promise }`, the promise resolving with the statuses and any delivery error.
    #[napi(
        catch_unwind,
        ts_return_type = "{ op: number, promise: Promise<NotifiedTransfer> }"
    )]
    pub fn transfer_notify<'env>(
        &self,
        env: &'env Env,
        requests_js: Vec<TransferRequest>,
        notify: Buffer,
    ) -> napi::Result<Object<'env>, String> {
        let reqs = requests(&requests_js, &self.engine.handles()).map_err(js_error)?;
        let (settle, promise) = Settle::<NotifiedTransfer>::new(env).map_err(internal)?;
        let op = self
            .engine
            .transfer_notify(&reqs, notify.to_vec(), move |snaps, err| {
                settle.resolve(NotifiedTransfer {
                    tasks: snaps.into_iter().map(TaskStatusJs::from).collect(),
                    notify_error: err.as_ref().map(NotifyResult::error),
                });
            })
            .map_err(js_error)?;
        let mut out = Object::new(env).map_err(internal)?;
        out.set("op", op as f64).map_err(internal)?;
        out.set("promise", promise).map_err(internal)?;
        Ok(out)
    }

    /// `submitTransfer` with a notification sent once every task of it completed.
    #[napi(catch_unwind)]
    pub fn submit_transfer_notify(
        &self,
        batch: f64,
        requests_js: Vec<TransferRequest>,
        notify: Buffer,
    ) -> napi::Result<u32, String> {
        let batch = to_u64(batch, "batch").map_err(js_error)?;
        let reqs = requests(&requests_js, &self.engine.handles()).map_err(js_error)?;
        let first = self
            .engine
            .submit_transfer_notify(batch, &reqs, notify.to_vec())
            .map_err(js_error)?;
        Ok(first as u32)
    }

    /// Sends a notification without data; resolves with its outcome.
    #[napi(catch_unwind, ts_return_type = "Promise<NotifyResult>")]
    pub fn notify<'env>(
        &self,
        env: &'env Env,
        segment: f64,
        data: Buffer,
    ) -> napi::Result<Object<'env>, String> {
        let handle = to_u64(segment, "segment").map_err(js_error)?;
        let handle = self
            .engine
            .handles()
            .decode(ferry_core::handle::HandleKind::Segment, handle)
            .map_err(js_error)?;
        // Handed to the outbox here, on the JS thread: calls leave in the order made.
        let sent = self.engine.notify(handle, &data);
        let (settle, promise) = Settle::<NotifyResult>::new(env).map_err(internal)?;
        self.engine
            .spawn(async move { settle.resolve(NotifyResult::of(sent.await)) })
            .map_err(js_error)?;
        Ok(promise)
    }

    /// Takes up to `max` notifications that arrived, oldest first.
    #[napi(catch_unwind)]
    pub fn take_notifications(&self, max: f64) -> napi::Result<Vec<NotificationJs>, String> {
        let max = to_u64(max, "max").map_err(js_error)?;
        let notes = self
            .engine
            .take_notifications(usize::try_from(max).unwrap_or(usize::MAX))
            .map_err(js_error)?;
        Ok(notes
            .into_iter()
            .map(|n| NotificationJs {
                from: n.from,
                engine_id: n.engine_id.to_string(),
                data: n.data.into(),
                bytes: n.bytes as f64,
            })
            .collect())
    }

    /// Sets the function told when notifications wait or were dropped. It does not keep
    /// Node alive.
    #[napi(catch_unwind)]
    pub fn set_notification_handler(
        &self,
        callback: Function<NotifySignalJs, ()>,
    ) -> napi::Result<(), String> {
        let call = crate::callback::weak_handler(callback)?;
        self.engine
            .set_notification_waker(Some(std::sync::Arc::new(move |sig| {
                call(match sig {
                    InboxSignal::Ready => NotifySignalJs {
                        kind: "ready".into(),
                        from: None,
                        total: None,
                    },
                    InboxSignal::Dropped { from, total } => NotifySignalJs {
                        kind: "dropped".into(),
                        from: Some(from),
                        total: Some(total as f64),
                    },
                })
            })));
        Ok(())
    }
}
