#!/usr/bin/env bash
#
# deploy/local/demo-fulfilment.sh: the whole system (called by demo.sh with the environment
# exported). order-service, wms-consumer and stock-consumer each own a database with an outbox
# and an inbox, each database has its own outbox-relay, and events flow through the broker:
# orders are paid (with duplicate callbacks), stock reserves them, the warehouse ships them;
# refunds before and after shipping, a closed refund and an order without enough stock take the
# reverse flows. Ends with a consistency summary across the three databases.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STATE_DIR="${STATE_DIR:?}"
BIN=target/release
SECRET=demo-callback-secret
ORD=http://127.0.0.1:18090 WMS=http://127.0.0.1:18091 STK=http://127.0.0.1:18092
base="${DATABASE_URL%/*}"
FO="$base/f_orders" FW="$base/f_wms" FS="$base/f_stock"
# Topics of their own (fulfilment.order, fulfilment.stock, fulfilment.outbound), apart from the
# first parts of the demo. Every service and relay reads the prefix from this variable.
export OUTBOX_TOPIC_PREFIX=fulfilment.

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# shellcheck source=deploy/local/demo-auth.sh
. deploy/local/demo-auth.sh
signed() { callback "$ORD" "$1" "$2" >/dev/null; }
# The warehouse and the catalog act with the operator's token; customers with their own.
json_post() { ops -X POST "$1" -H 'Content-Type: application/json' -d "$2"; }
customer_post() { as "$1" -X POST "$2" -H 'Content-Type: application/json' -d "$3"; } # user url body
# wait_until DESCRIPTION SECONDS COMMAND...: poll COMMAND until it succeeds, or fail.
wait_until() {
    local what="$1" secs="$2"; shift 2
    for _ in $(seq 1 $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
    echo "timed out waiting for $what" >&2; return 1
}
start() { # name command...
    local name="$1"; shift
    "$@" >"$STATE_DIR/$name.log" 2>&1 &
    echo $! >"$STATE_DIR/$name.pid"
}

for db in f_orders f_wms f_stock; do
    psql -q "$DATABASE_URL" -tc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
        || psql -q "$DATABASE_URL" -c "CREATE DATABASE $db"
done

say "Starting order-service, wms-consumer, stock-consumer and one relay per database"
start f-order-service env PAYMENT_CALLBACK_SECRET=$SECRET $BIN/order-service --listen 127.0.0.1:18090 \
    --database-url "$FO" --group-id demo-order --create-missing-topics
start f-wms $BIN/wms-consumer --listen 127.0.0.1:18091 --database-url "$FW" --group-id demo-wms --create-missing-topics
start f-stock $BIN/stock-consumer --listen 127.0.0.1:18092 --database-url "$FS" --group-id demo-stock --create-missing-topics
i=0
for db in "$FO" "$FW" "$FS"; do
    i=$((i + 1))
    start "f-relay-$i" $BIN/outbox-relay run --database-url "$db" --create-missing-topics \
        --metrics-addr "127.0.0.1:919$i" --instance-id "demo-relay-$i"
done
for u in $ORD $WMS $STK; do wait_until "$u/healthz" 60 curl -sf "$u/healthz"; done

say "Catalog and stock (the 'rare' vase has 1 unit)"
for s in lamp:2500 chair:8900 vase:9999; do
    ops -X PUT "$ORD/skus/${s%:*}" -H 'Content-Type: application/json' -d "{\"name\":\"${s%:*}\",\"price_cents\":${s#*:}}" >/dev/null
done
for s in lamp:50 chair:50 vase:1; do
    ops -X PUT "$STK/stock/${s%:*}" -H 'Content-Type: application/json' -d "{\"on_hand\":${s#*:}}" >/dev/null
done
psql -qtA "$FS" -F ' ' -c "SELECT sku_id, on_hand, reserved FROM stock ORDER BY 1" | sed 's/^/  /'

say "12 customers order a lamp and a chair and pay; the provider calls back twice each"
orders=()
for n in $(seq 1 12); do
    o=$(as "u$n" -X POST "$ORD/orders" -H 'Content-Type: application/json' -H "Idempotency-Key: k$n" \
        -d '{"items":[{"sku_id":"lamp","quantity":1},{"sku_id":"chair","quantity":1}]}' | jq -r .order_id)
    orders+=("$o")
    pay=$(jq -nc --arg o "$o" --arg t "tx-$n" '{order_id:$o, transaction_id:$t, amount_cents:11400, status:"SUCCESS"}')
    signed /payments/callback "$pay"; signed /payments/callback "$pay"
done
echo "${#orders[@]} orders paid"

say "Someone orders 2 vases (only 1 in stock) and pays"
V=$(as u99 -X POST "$ORD/orders" -H 'Content-Type: application/json' -H 'Idempotency-Key: kv' \
    -d '{"items":[{"sku_id":"vase","quantity":2}]}' | jq -r .order_id)
signed /payments/callback "$(jq -nc --arg o "$V" '{order_id:$o, transaction_id:"tx-vase", amount_cents:19998, status:"SUCCESS"}')"

outbound_of() { ops "$WMS/outbounds?order_id=$1" | jq -r '.outbounds[0].outbound_no // empty'; }
has_outbound() { [[ -n "$(outbound_of "$1")" ]]; }
order_status() { ops "$ORD/orders/$1" | jq -r .status; }
outbound_status() { ops "$WMS/outbounds/$1" | jq -r .status; }
status_is() { [[ "$($1 "$2")" == "$3" ]]; }

say "Stock reserves, the warehouse creates outbound orders"
for o in "${orders[@]}"; do wait_until "an outbound for $o" 60 has_outbound "$o"; done
wait_until "the vase order to be cancelled" 60 status_is order_status "$V" CANCELLED
echo "vase order: $(order_status "$V") (payment flagged for refund), outbound: '$(outbound_of "$V")'"

say "Refund before shipping (order 9): the warehouse intercepts, the refund succeeds, stock is released"
O9=${orders[8]} OB9=$(outbound_of "${orders[8]}")
customer_post u9 "$ORD/orders/$O9/refunds" '{"refund_no":"rf-9","amount_cents":11400,"reason":"changed my mind"}' >/dev/null
wait_until "outbound 9 intercepted" 60 status_is outbound_status "$OB9" INTERCEPTED
echo "shipping it anyway: $(json_post "$WMS/outbounds/$OB9/ship" '{"carrier":"DHL","tracking_no":"T9"}' | jq -c .error.code)"
signed /refunds/callback '{"refund_no":"rf-9","status":"SUCCESS","modified":1}'
wait_until "outbound 9 cancelled" 60 status_is outbound_status "$OB9" CANCELLED

say "Refund closed (order 10): intercepted, then resumed and shipped"
O10=${orders[9]} OB10=$(outbound_of "${orders[9]}")
customer_post u10 "$ORD/orders/$O10/refunds" '{"refund_no":"rf-10","amount_cents":2500,"reason":"scratch"}' >/dev/null
wait_until "outbound 10 intercepted" 60 status_is outbound_status "$OB10" INTERCEPTED
signed /refunds/callback '{"refund_no":"rf-10","status":"CLOSED","modified":1}'
wait_until "outbound 10 resumed" 60 status_is outbound_status "$OB10" CREATED

say "The warehouse ships orders 1-8, 10-12 (order 1 twice: the same parcel is not shipped twice)"
for n in 1 2 3 4 5 6 7 8 10 11 12; do
    ob=$(outbound_of "${orders[$((n - 1))]}")
    json_post "$WMS/outbounds/$ob/ship" '{"carrier":"DHL","tracking_no":"T'$n'"}' >/dev/null
done
json_post "$WMS/outbounds/$(outbound_of "${orders[0]}")/ship" '{"carrier":"DHL","tracking_no":"T1"}' | jq -c '{outbound_no, status}'
for n in 1 2 3 4 5 6 7 8 10 11 12; do
    wait_until "order $n shipped" 60 status_is order_status "${orders[$((n - 1))]}" SHIPPED
done

say "Refund after shipping (order 1): recall, the return arrives, stock is restocked"
O1=${orders[0]} OB1=$(outbound_of "${orders[0]}")
customer_post u1 "$ORD/orders/$O1/refunds" '{"refund_no":"rf-1","amount_cents":11400,"reason":"broken"}' >/dev/null
wait_until "outbound 1 recalled" 60 status_is outbound_status "$OB1" RECALL
ops -X POST "$WMS/outbounds/$OB1/return-received" | jq -c '{outbound_no, status}'
restocked() { [[ "$(psql -qtA "$FS" -c "SELECT status FROM reservations WHERE order_id = '$O1'")" == RESTOCKED ]]; }
wait_until "order 1 restocked" 60 restocked

say "Waiting for every outbox to drain"
drained() { for db in "$FO" "$FW" "$FS"; do [[ "$($BIN/outbox-relay status --database-url "$db" --json | jq .unpublished)" == 0 ]] || return 1; done; }
wait_until "the outboxes to drain" 60 drained

say "Consistency summary"
echo "orders by status:";      psql -qtA "$FO" -F ' ' -c "SELECT status, count(*) FROM orders GROUP BY 1 ORDER BY 1" | sed 's/^/  /'
echo "outbounds by status:";   psql -qtA "$FW" -F ' ' -c "SELECT status, count(*) FROM outbounds GROUP BY 1 ORDER BY 1" | sed 's/^/  /'
echo "reservations by status:"; psql -qtA "$FS" -F ' ' -c "SELECT status, count(*) FROM reservations GROUP BY 1 ORDER BY 1" | sed 's/^/  /'
echo "stock (sku on_hand reserved):"; psql -qtA "$FS" -F ' ' -c "SELECT sku_id, on_hand, reserved FROM stock ORDER BY 1" | sed 's/^/  /'
for p in "order:$FO" "wms:$FW" "stock:$FS"; do
    echo "inbox ${p%%:*}: $(psql -qtA "${p#*:}" -c "SELECT count(*) || ' events applied, ' || COALESCE(sum(duplicates), 0) || ' duplicates skipped' FROM inbox")"
done
paid=$(psql -qtA "$FO" -c "SELECT string_agg(quote_literal(order_id::text), ',') FROM orders WHERE status IN ('PAID', 'SHIPPED')")
ob=$(psql -qtA "$FW" -c "SELECT count(*) FROM outbounds WHERE order_id::text IN ($paid)")
rs=$(psql -qtA "$FS" -c "SELECT count(DISTINCT order_id) FROM stock_movements WHERE kind = 'RESERVE' AND order_id::text IN ($paid)")
np=$(psql -qtA "$FO" -c "SELECT count(*) FROM orders WHERE status IN ('PAID', 'SHIPPED')")
echo "paid or shipped orders: $np, with an outbound: $ob, with a reservation: $rs"
echo "vase order (no stock): outbound='$(outbound_of "$V")' reservation=$(psql -qtA "$FS" -c "SELECT status FROM reservations WHERE order_id = '$V'")"
[[ "$ob" == "$np" && "$rs" == "$np" && -z "$(outbound_of "$V")" ]] && echo "CONSISTENT: one outbound and one reservation per paid order, none for the rejected one"

for f in "$STATE_DIR"/f-*.pid; do kill -TERM "$(cat "$f")" 2>/dev/null || true; done
