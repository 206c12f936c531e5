//! The push plan: each change is sent `push_copies` times under one `msg_id`, sometimes once
//! more under a new one, or never (dropped); every send is counted.

use rand::Rng;
use serde_json::Value;

use super::Platform;

impl Platform {
    /// Pushes each message per the fault settings, one after the other.
    pub(super) async fn push_all(&self, messages: Vec<Value>) {
        for m in messages {
            self.push(m).await;
        }
    }

    async fn push(&self, mut message: Value) {
        let (url, copies, again, drop) = {
            let mut s = self.lock();
            let f = s.faults.clone();
            let mut rng = rand::thread_rng();
            let drop = rng.gen_bool(f.drop_ratio.clamp(0.0, 1.0));
            let again = rng.gen_bool(f.new_msg_id_ratio.clamp(0.0, 1.0));
            if drop || f.push_url.is_none() {
                s.calls.pushes_dropped += 1;
            }
            (f.push_url, f.push_copies.max(1), again, drop)
        };
        let Some(url) = url.filter(|_| !drop) else {
            return;
        };
        for _ in 0..copies {
            self.send(&url, &message).await;
        }
        if again {
            message["msg_id"] = Value::from(uuid::Uuid::new_v4().to_string());
            self.lock().calls.pushes_new_msg_id += 1;
            self.send(&url, &message).await;
        }
    }

    async fn send(&self, url: &str, message: &Value) {
        let body = serde_json::to_vec(message).unwrap_or_default();
        let signature = self.secret.sign(&body);
        let answer = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("x-signature", signature)
            .body(body)
            .send()
            .await;
        let ok = match answer {
            Ok(r) if r.status().is_success() => true,
            Ok(r) => {
                tracing::info!(
                    http.status = r.status().as_u16(),
                    "Push refused by the seller"
                );
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, "Push failed");
                false
            }
        };
        let mut s = self.lock();
        s.calls.pushes_sent += 1;
        if ok {
            s.calls.pushes_accepted += 1;
        } else {
            s.calls.pushes_failed += 1;
        }
    }
}
