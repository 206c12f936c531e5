#!/usr/bin/env bash
#
# deploy/local/demo-orders.sh: the order-service part of the demo (called by demo.sh with the
# environment exported). Runs order-service on its own database with its own relay, then plays
# what real clients do: double-clicked orders, a payment provider calling back several times at
# once, a cancellation, a refund with out-of-order refund notifications; and shows that every
# business effect happened once, on the service and on the broker.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STATE_DIR="${STATE_DIR:?}"
SECRET=demo-callback-secret
ADDR=127.0.0.1:${ORDER_PORT:-18080}
BASE="http://$ADDR"
ORDERS_URL="${DATABASE_URL%/*}/orders"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
BIN=target/release
# shellcheck source=deploy/local/demo-auth.sh
. deploy/local/demo-auth.sh
post_signed() { callback "$BASE" "$@"; } # path body

psql -q "$DATABASE_URL" -tc "SELECT 1 FROM pg_database WHERE datname = 'orders'" | grep -q 1 \
    || psql -q "$DATABASE_URL" -c "CREATE DATABASE orders"

say "Starting order-service on $ADDR (database orders) and a relay for its outbox"
PAYMENT_CALLBACK_SECRET=$SECRET target/release/order-service --listen "$ADDR" --database-url "$ORDERS_URL" \
    >"$STATE_DIR/order-service.log" 2>&1 &
echo $! >"$STATE_DIR/order-service.pid"
target/release/outbox-relay run --database-url "$ORDERS_URL" --metrics-addr 127.0.0.1:9188 \
    --instance-id orders-relay >"$STATE_DIR/orders-relay.log" 2>&1 &
echo $! >"$STATE_DIR/orders-relay.pid"
for _ in $(seq 1 100); do curl -sf "$BASE/healthz" >/dev/null && break; sleep 0.1; done

say "Catalog (operator token): prices come from here, never from the client"
echo "without a token:"; curl -s -X PUT "$BASE/skus/lamp" -H 'Content-Type: application/json' -d '{"name":"Desk lamp","price_cents":1}'; echo
echo "as a customer:"; as alice -X PUT "$BASE/skus/lamp" -H 'Content-Type: application/json' -d '{"name":"Desk lamp","price_cents":1}'; echo
ops -X PUT "$BASE/skus/lamp" -H 'Content-Type: application/json' -d '{"name":"Desk lamp","price_cents":2500}'; echo
ops -X PUT "$BASE/skus/chair" -H 'Content-Type: application/json' -d '{"name":"Chair","price_cents":8900}'; echo

say "Alice double-clicks: 5 concurrent POST /orders with the same Idempotency-Key (the buyer is her token's subject)"
body='{"items":[{"sku_id":"lamp","quantity":2},{"sku_id":"chair","quantity":1}]}'
ALICE=$(token alice)
pids=()
for i in 1 2 3 4 5; do
    curl -s -D - -o "$STATE_DIR/create.$i" -X POST "$BASE/orders" -H 'Content-Type: application/json' \
        -H "Authorization: Bearer $ALICE" \
        -H 'Idempotency-Key: alice-checkout-1' -d "$body" | grep -iE '^(HTTP|idempotent-replayed)' | tr -d '\r' | paste -sd' ' &
    pids+=($!)
done
wait "${pids[@]}"
A=$(jq -r .order_id "$STATE_DIR/create.1")
echo "order ids returned: $(jq -r .order_id "$STATE_DIR"/create.* | sort | uniq -c | tr -s ' ')"

say "Same key, different body: refused"
as alice -X POST "$BASE/orders" -H 'Content-Type: application/json' -H 'Idempotency-Key: alice-checkout-1' \
    -d '{"items":[{"sku_id":"lamp","quantity":9}]}'; echo

say "Bob orders, then cancels before paying (twice)"
B=$(as bob -X POST "$BASE/orders" -H 'Content-Type: application/json' -H 'Idempotency-Key: bob-1' \
    -d '{"items":[{"sku_id":"chair","quantity":1}]}' | jq -r .order_id)
echo "Alice tries to cancel Bob's order (it does not exist for her):"
as alice -X POST "$BASE/orders/$B/cancel"; echo
as bob -X POST "$BASE/orders/$B/cancel" | jq -c '{order_id, status}'
as bob -X POST "$BASE/orders/$B/cancel" | jq -c '{order_id, status}'

say "The payment provider calls back 5 times at once for Alice's order (signed)"
pay=$(jq -nc --arg o "$A" '{order_id:$o, transaction_id:"pay-777", amount_cents:13900, status:"SUCCESS"}')
pids=()
for _ in 1 2 3 4 5; do post_signed /payments/callback "$pay" & pids+=($!); done
wait "${pids[@]}"; echo
echo "a forged callback:"; curl -s -X POST "$BASE/payments/callback" -H "X-Signature-Timestamp: $(date +%s)" -H 'X-Signature: 00' -d "$pay"; echo
old=$(( $(date +%s) - 600 ))
old_sig=$(printf '%s.%s' "$old" "$pay" | openssl dgst -sha256 -hmac "$SECRET" -r | cut -d' ' -f1)
echo "a correctly signed callback from 10 minutes ago (a replay):"
curl -s -X POST "$BASE/payments/callback" -H "X-Signature-Timestamp: $old" -H "X-Signature: $old_sig" -d "$pay"; echo

say "Alice asks for a partial refund (twice, same refund_no); the provider's notifications arrive out of order"
for _ in 1 2; do
    as alice -X POST "$BASE/orders/$A/refunds" -H 'Content-Type: application/json' \
        -d '{"refund_no":"rf-1","amount_cents":2500,"reason":"lamp arrived broken"}' | jq -c '{refund_no, status, amount_cents}'
done
post_signed /refunds/callback '{"refund_no":"rf-1","status":"SUCCESS","modified":2000}'; echo
post_signed /refunds/callback '{"refund_no":"rf-1","status":"CLOSED","modified":1000}'; echo

say "Outcome on the service"
as alice "$BASE/orders/$A" | jq -c '{status, amount_cents, payments: [.payments[] | {transaction_id, status}], refunds: [.refunds[] | {refund_no, status}]}'
as bob "$BASE/orders/$B" | jq -c '{status}'
psql -q "$ORDERS_URL" -c "SELECT status, count(*) AS orders FROM orders GROUP BY status ORDER BY status"

say "Outcome on the broker (outbox.event.order, read with kafka-python)"
for _ in $(seq 1 100); do
    [[ "$(target/release/outbox-relay status --database-url "$ORDERS_URL" --json | jq .unpublished)" == 0 ]] && break
    sleep 0.2
done
"$PYTHON" tests/tools/kafka_tool.py dump --brokers "$KAFKA_BROKERS" --topic outbox.event.order \
    | jq -r --arg a "$A" --arg b "$B" 'select(.key == $a or .key == $b)
        | "\(if .key == $a then "alice" else "bob  " end)  partition \(.partition) offset \(.offset)  \(.headers.event_type)"'

kill -TERM "$(cat "$STATE_DIR/orders-relay.pid")" "$(cat "$STATE_DIR/order-service.pid")" 2>/dev/null || true
