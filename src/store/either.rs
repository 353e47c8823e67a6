//! The agent's rendezvous store: muster's TCP store, etcd or the Kubernetes API server, one type for the
//! rendezvous and the driver.

use std::time::Duration;

use tokio::sync::mpsc;

use super::etcd::EtcdStore;
use super::k8s::KubeStore;
use super::remote::RemoteStore;
use super::{Reach, Store, StoreError, WatchEvent, WatchTarget};

pub enum RdzvStore {
    Tcp(RemoteStore),
    Etcd(EtcdStore),
    Kube(Box<KubeStore>),
}

impl RdzvStore {
    /// Where it is, for the banner.
    pub fn describe(&self) -> String {
        match self {
            RdzvStore::Tcp(s) => s.addr().to_string(),
            RdzvStore::Etcd(s) => s.endpoints().to_string(),
            RdzvStore::Kube(s) => s.describe(),
        }
    }
}

/// The same call on whichever store this is.
macro_rules! each {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            RdzvStore::Tcp($s) => $call.await,
            RdzvStore::Etcd($s) => $call.await,
            RdzvStore::Kube($s) => $call.await,
        }
    };
}

impl Store for RdzvStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        each!(self, s => s.set(key, value))
    }
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        each!(self, s => s.get(key))
    }
    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        each!(self, s => s.add(key, delta))
    }
    async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        each!(self, s => s.compare_set(key, expected, desired))
    }
    async fn wait(&self, key: &str, timeout: Duration) -> Result<bool, StoreError> {
        each!(self, s => s.wait(key, timeout))
    }
    async fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        each!(self, s => s.multi_set(pairs))
    }
    async fn multi_get(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        each!(self, s => s.multi_get(keys))
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        each!(self, s => s.list(prefix))
    }
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        each!(self, s => s.scan(prefix))
    }
    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        each!(self, s => s.delete(key))
    }
    async fn beat(&self, key: &str, value: &[u8], timeout: Duration) -> Result<(), StoreError> {
        each!(self, s => s.beat(key, value, timeout))
    }
    async fn ping(&self, key: &str, timeout: Duration) -> Result<(), StoreError> {
        each!(self, s => s.ping(key, timeout))
    }
    async fn reach(&self, timeout: Duration) -> Reach {
        each!(self, s => s.reach(timeout))
    }
    async fn set_session(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        each!(self, s => s.set_session(key, value))
    }
    async fn forget_job(&self, keep: &str) -> Result<(), StoreError> {
        each!(self, s => s.forget_job(keep))
    }
    async fn watch(&self, targets: &[WatchTarget]) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        each!(self, s => s.watch(targets))
    }
}
