//! Test parts: a real Synapse ([`synapse`]), a scripted kernel
//! ([`kernel`]), and people who talk to the bot through their own Matrix
//! clients ([`Person`]).

#![allow(dead_code)]

pub mod kernel;
pub mod synapse;

use std::time::{Duration, Instant};

use matrix_sdk::config::SyncSettings;
use matrix_sdk::ruma::api::client::room::create_room::v3::{Request as CreateRoom, RoomPreset};
use matrix_sdk::ruma::events::room::member::MembershipState;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use matrix_sdk::ruma::{EventId, OwnedEventId, OwnedUserId, UserId};
use matrix_sdk::{Client, Room};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use gsv_adapter_matrix::{AdapterError, Config};

use kernel::WAIT;
use synapse::Synapse;

pub const PASSWORD: &str = "correct horse battery staple";
pub const SERVICE_TOKEN: &str = "gsv_service_test_token";

/// Someone with a Matrix account on the test homeserver.
#[derive(Debug)]
pub struct Person {
    pub client: Client,
    pub user_id: OwnedUserId,
}

impl Person {
    pub async fn register(synapse: &Synapse, name: &str) -> Person {
        let user_id = synapse.register(name, PASSWORD).await;
        let client = Client::builder()
            .homeserver_url(&synapse.url)
            .build()
            .await
            .unwrap();
        client
            .matrix_auth()
            .login_username(&user_id, PASSWORD)
            .send()
            .await
            .unwrap();
        client.sync_once(SyncSettings::new()).await.unwrap();
        Person {
            client,
            user_id: OwnedUserId::try_from(user_id).unwrap(),
        }
    }

    async fn sync(&self) -> matrix_sdk::sync::SyncResponse {
        self.client
            .sync_once(SyncSettings::new().timeout(Duration::from_secs(1)))
            .await
            .unwrap()
    }

    /// A direct chat with `bot`, once the bot has joined it.
    pub async fn dm_with(&self, bot: &UserId) -> Room {
        let mut req = CreateRoom::new();
        req.invite = vec![bot.to_owned()];
        req.is_direct = true;
        req.preset = Some(RoomPreset::TrustedPrivateChat);
        let room = self.client.create_room(req).await.unwrap();
        self.wait_joined(&room, bot).await;
        room
    }

    /// A private room with `others` invited, once `bot` has joined it.
    pub async fn group_with(&self, bot: &UserId, others: &[&UserId]) -> Room {
        let mut req = CreateRoom::new();
        req.invite = std::iter::once(bot)
            .chain(others.iter().copied())
            .map(ToOwned::to_owned)
            .collect();
        req.preset = Some(RoomPreset::PrivateChat);
        req.name = Some("team".into());
        let room = self.client.create_room(req).await.unwrap();
        self.wait_joined(&room, bot).await;
        room
    }

    /// Joins `room` (someone else's handle of it); returns this person's.
    pub async fn join(&self, room: &Room) -> Room {
        self.client.join_room_by_id(room.room_id()).await.unwrap()
    }

    pub async fn wait_joined(&self, room: &Room, who: &UserId) {
        let started = Instant::now();
        loop {
            self.sync().await;
            let member = room.get_member_no_sync(who).await.unwrap();
            if member.is_some_and(|m| *m.membership() == MembershipState::Join) {
                return;
            }
            assert!(
                started.elapsed() < WAIT,
                "{who} did not join {}",
                room.room_id()
            );
        }
    }

    pub async fn say(&self, room: &Room, content: RoomMessageEventContent) -> OwnedEventId {
        room.send(content).await.unwrap().response.event_id
    }

    /// An event of `room` as this person's homeserver shows it.
    pub async fn event(&self, room: &Room, id: &str) -> Value {
        let id = EventId::parse(id).unwrap();
        let ev = room.event(&id, None).await.unwrap();
        serde_json::from_str(ev.raw().json().get()).unwrap()
    }

    /// The next message `from` posts in `room`, as raw event JSON.
    pub async fn next_message_from(&self, room: &Room, from: &UserId) -> Value {
        self.messages_from(room, from, 1).await.remove(0)
    }

    /// The next `n` messages `from` posts in `room`, in timeline order
    /// (several may arrive in one sync).
    pub async fn messages_from(&self, room: &Room, from: &UserId, n: usize) -> Vec<Value> {
        let started = Instant::now();
        let mut seen = Vec::new();
        loop {
            let r = self.sync().await;
            if let Some(update) = r.rooms.joined.get(room.room_id()) {
                for ev in &update.timeline.events {
                    let v: Value = serde_json::from_str(ev.raw().json().get()).unwrap();
                    if v["type"] == "m.room.message" && v["sender"] == from.as_str() {
                        seen.push(v);
                    }
                }
            }
            if seen.len() >= n {
                return seen;
            }
            assert!(
                started.elapsed() < WAIT,
                "{} of {n} messages from {from} in time: {seen:?}",
                seen.len()
            );
        }
    }

    /// Messages of `room` that arrived since the last sync, from anyone.
    pub async fn new_messages(&self, room: &Room) -> Vec<Value> {
        let r = self.sync().await;
        let Some(update) = r.rooms.joined.get(room.room_id()) else {
            return Vec::new();
        };
        update
            .timeline
            .events
            .iter()
            .map(|ev| serde_json::from_str::<Value>(ev.raw().json().get()).unwrap())
            .filter(|v| v["type"] == "m.room.message")
            .collect()
    }
}

/// The adapter running in this process against `kernel_url`.
#[derive(Debug)]
pub struct Adapter {
    pub stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), AdapterError>>>,
}

pub fn config(synapse: &Synapse, kernel_url: &str, bot: &UserId) -> Config {
    let mut c = Config::new(
        kernel_url.to_owned(),
        SERVICE_TOKEN.to_owned(),
        synapse.url.clone(),
        bot.to_string(),
        PASSWORD.to_owned(),
    );
    c.sync_timeout = Duration::from_secs(5);
    c.min_backoff = Duration::from_millis(100);
    c.max_backoff = Duration::from_secs(1);
    c
}

impl Adapter {
    pub fn start(config: Config) -> Adapter {
        // `RUST_LOG=gsv_adapter_matrix=debug` shows what the adapter does.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let stop = CancellationToken::new();
        let task = tokio::spawn(gsv_adapter_matrix::run(config, stop.clone()));
        Adapter {
            stop,
            task: Some(task),
        }
    }

    /// Stops it and returns how it ended.
    pub async fn stop(self) -> Result<(), AdapterError> {
        self.stop.cancel();
        self.finished().await
    }

    /// Waits for it to end on its own.
    pub async fn finished(mut self) -> Result<(), AdapterError> {
        let task = self.task.take().unwrap();
        tokio::time::timeout(WAIT, task)
            .await
            .expect("the adapter did not stop in time")
            .unwrap()
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
