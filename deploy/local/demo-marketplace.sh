#!/usr/bin/env bash
#
# deploy/local/demo-marketplace.sh: a short marketplace flow (called by demo.sh with the
# environment exported; BIN overrides the binaries' directory). The marketplace simulator
# pushes signed TradeSync/RefundSync messages to the order service with the platform's faults
# (every push twice, some under a new msg_id, refund snapshots newest first, 20 % dropped); one
# compensation pass recovers what was lost; the warehouse ships and the order service reports
# each tracking number back to the platform once. Ends with the counts per dedupe layer.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STATE_DIR="${STATE_DIR:?}"
BIN="${BIN:-target/release}"
SECRET=demo-callback-secret MSECRET=demo-marketplace-secret
ORD=http://127.0.0.1:18190 WMS=http://127.0.0.1:18191 STK=http://127.0.0.1:18192 SIM=http://127.0.0.1:18193
base="${DATABASE_URL%/*}"
MO="$base/m_orders" MW="$base/m_wms" MS="$base/m_stock"
export OUTBOX_TOPIC_PREFIX=marketplace.

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
json_post() { curl -s -X POST "$1" -H 'Content-Type: application/json' -d "$2"; }
# shellcheck source=deploy/local/demo-auth.sh
. deploy/local/demo-auth.sh
ops_post() { ops -X POST "$1" -H 'Content-Type: application/json' -d "$2"; }
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
stop_all() { for f in "$STATE_DIR"/m-*.pid; do [[ -f "$f" ]] && kill -TERM "$(cat "$f")" 2>/dev/null; rm -f "$f"; done; }
trap stop_all EXIT

for db in m_orders m_wms m_stock; do
    psql -q "$DATABASE_URL" -tc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
        || psql -q "$DATABASE_URL" -c "CREATE DATABASE $db"
done

say "Starting the marketplace simulator, the three services and one relay per database"
start m-sim env MARKETPLACE_SECRET=$MSECRET $BIN/marketplace-sim --listen 127.0.0.1:18193 \
    --push-url "$ORD/channels/marketplace/push" --push-copies 2 --new-msg-id-ratio 0.3 \
    --drop-ratio 0.2 --refunds-out-of-order --ship-fail-times 2
start m-order-service env PAYMENT_CALLBACK_SECRET=$SECRET MARKETPLACE_SECRET=$MSECRET \
    $BIN/order-service --listen 127.0.0.1:18190 --database-url "$MO" --group-id mdemo-order \
    --create-missing-topics --marketplace-url "$SIM"
start m-wms $BIN/wms-consumer --listen 127.0.0.1:18191 --database-url "$MW" --group-id mdemo-wms --create-missing-topics
start m-stock $BIN/stock-consumer --listen 127.0.0.1:18192 --database-url "$MS" --group-id mdemo-stock --create-missing-topics
i=0
for db in "$MO" "$MW" "$MS"; do
    i=$((i + 1))
    start "m-relay-$i" $BIN/outbox-relay run --database-url "$db" --create-missing-topics \
        --metrics-addr "127.0.0.1:928$i" --instance-id "mdemo-relay-$i"
done
for u in $ORD $WMS $STK $SIM; do wait_until "$u/healthz" 60 curl -sf "$u/healthz"; done
ops -X PUT "$ORD/skus/mk-lamp" -H 'Content-Type: application/json' -d '{"name":"lamp","price_cents":2500}' >/dev/null
ops -X PUT "$STK/stock/mk-lamp" -H 'Content-Type: application/json' -d '{"on_hand":20}' >/dev/null
ops -X PUT "$ORD/skus/mk-shade" -H 'Content-Type: application/json' -d '{"name":"lamp shade","price_cents":1000}' >/dev/null
ops -X PUT "$STK/stock/mk-shade" -H 'Content-Type: application/json' -d '{"on_hand":20}' >/dev/null

say "8 buyers place and pay trades on the platform; trade 5 is refunded in full before shipping, trade 6 gets a 1.00 price adjustment (refund only), trade 7's buyer asks for 25.00 back and lowers it to 8.00 before the platform pays it"
for n in $(seq 1 8); do
    json_post "$SIM/trades" '{"tid":"MK-'$n'","buyer_id":"b'$n'","items":[{"sku_id":"mk-lamp","quantity":1}],"paid_cents":2500,"pay":true}' >/dev/null
done
json_post "$SIM/trades/MK-5/refunds" '{"refund_id":"RF-5","refund_cents":2500,"kind":"RETURN_AND_REFUND","statuses":["WAIT_SELLER_AGREE","SUCCESS"]}' >/dev/null
json_post "$SIM/trades/MK-6/refunds" '{"refund_id":"RF-6","refund_cents":100,"kind":"REFUND_ONLY","statuses":["WAIT_SELLER_AGREE","SUCCESS"]}' >/dev/null
json_post "$SIM/trades/MK-7/refunds" '{"refund_id":"RF-7","refund_cents":2500,"kind":"RETURN_AND_REFUND","statuses":["WAIT_SELLER_AGREE","WAIT_SELLER_AGREE","SUCCESS"],"amounts":[2500,800,800]}' >/dev/null
say "Trade MK-9 buys 2 lamps and a shade; before shipping the buyer sends one lamp back by line (RF-9, 25.00): the warehouse ships the other lamp and the shade"
json_post "$SIM/trades" '{"tid":"MK-9","buyer_id":"b9","items":[{"sku_id":"mk-lamp","quantity":2},{"sku_id":"mk-shade","quantity":1}],"paid_cents":6000,"pay":true}' >/dev/null
json_post "$SIM/trades/MK-9/refunds" '{"refund_id":"RF-9","refund_cents":2500,"kind":"RETURN_AND_REFUND","statuses":["WAIT_SELLER_AGREE","SUCCESS"],"items":[{"sku_id":"mk-lamp","quantity":1}]}' >/dev/null
say "Trade MK-10 buys 2 lamps and a shade too; it ships whole, and later one lamp comes back by line"
json_post "$SIM/trades" '{"tid":"MK-10","buyer_id":"b10","items":[{"sku_id":"mk-lamp","quantity":2},{"sku_id":"mk-shade","quantity":1}],"paid_cents":6000,"pay":true}' >/dev/null
curl -s "$SIM/calls" | jq -c '{changes, pushes_sent, pushes_new_msg_id, pushes_dropped, pushes_refused: .pushes_failed}'
echo "orders the service knows after the pushes: $(psql -qtA "$MO" -c "SELECT count(*) FROM channel_orders")"

say "One compensation pass (the query API since the durable watermark)"
ops_post "$ORD/channels/marketplace/compensate" '' | jq -c .
psql -qtA "$MO" -F ' ' -c "SELECT c.external_order_id, o.status FROM channel_orders c JOIN orders o USING (order_id) ORDER BY 1" | sed 's/^/  /'

say "The warehouse ships every outbound; the ship API fails twice per trade, then takes it"
outbound_of() { ops "$WMS/outbounds?order_id=$1" | jq -r '.outbounds[0] | select(.status == "CREATED") | .outbound_no // empty'; }
has_outbound() { [[ -n "$(outbound_of "$1")" ]]; }
lamps_to_ship() { [[ "$(ops "$WMS/outbounds?order_id=$1" | jq '.outbounds[0].lines[] | select(.sku_id == "mk-lamp") | .quantity')" == "$2" ]]; }
for n in 1 2 3 4 6 7 8 9 10; do
    o=$(psql -qtA "$MO" -c "SELECT order_id FROM channel_orders WHERE external_order_id = 'MK-$n'")
    # MK-9's outbound is intercepted until its refund by line took the lamp out.
    if [[ $n == 9 ]]; then wait_until "MK-9's outbound to drop the refunded lamp" 60 lamps_to_ship "$o" 1; fi
    wait_until "an outbound for MK-$n" 60 has_outbound "$o"
    ops_post "$WMS/outbounds/$(outbound_of "$o")/ship" '{"carrier":"SF","tracking_no":"SF'$n'"}' >/dev/null
done
all_shipped() { [[ "$(curl -s "$SIM/trades" | jq '[.[] | select(.status == "WAIT_BUYER_CONFIRM")] | length')" == 9 ]]; }
wait_until "the platform to show 9 trades shipped" 90 all_shipped

say "MK-10's buyer returns one lamp of two (RF-10, asked at 50.00, lowered to 25.00: one lamp); the warehouse receives it"
json_post "$SIM/trades/MK-10/refunds" '{"refund_id":"RF-10","refund_cents":2500,"kind":"RETURN_AND_REFUND","statuses":["WAIT_SELLER_AGREE","WAIT_BUYER_RETURN_GOODS","SUCCESS"],"amounts":[5000,2500,2500],"items":[{"sku_id":"mk-lamp","quantity":1}]}' >/dev/null
ops_post "$ORD/channels/marketplace/compensate" '' >/dev/null   # in case the platform's pushes were dropped
o10=$(psql -qtA "$MO" -c "SELECT order_id FROM channel_orders WHERE external_order_id = 'MK-10'")
ob10=$(ops "$WMS/outbounds?order_id=$o10" | jq -r '.outbounds[0].outbound_no')
recalled() { [[ "$(ops "$WMS/outbounds/$ob10" | jq -r .status)" == RECALL ]]; }
wait_until "MK-10's outbound to be recalled" 60 recalled
refund_succeeded() { [[ "$(psql -qtA "$MO" -c "SELECT status FROM refunds WHERE refund_no = 'marketplace:RF-10'")" == SUCCEEDED ]]; }
wait_until "RF-10 to succeed" 60 refund_succeeded
ops_post "$WMS/outbounds/$ob10/return-received" '' | jq -c '{outbound_no, status, lines}'
one_lamp_back() { [[ "$(psql -qtA "$MO" -c "SELECT returned_quantity FROM order_items WHERE order_id = '$o10' AND sku_id = 'mk-lamp'")" == 1 ]]; }
wait_until "the order service to record MK-10's lamp back" 60 one_lamp_back

say "Summary"
echo "platform trades:"; curl -s "$SIM/trades" | jq -r '.[] | "  \(.tid) \(.status) \(.out_sid // "-")"'
echo "our orders by status:"; psql -qtA "$MO" -F ' ' -c "SELECT status, count(*) FROM orders GROUP BY 1 ORDER BY 1" | sed 's/^/  /'
psql -qtA "$MO" -c "SELECT 'absorbed: layer 1 (msg_id) ' || COALESCE(sum(duplicates), 0) || ', layer 2 (same change, new msg_id) ' || count(*) FILTER (WHERE outcome = 'duplicate_change') || ', stale refund snapshots ' || count(*) FILTER (WHERE outcome = 'stale') || ', recovered by compensation ' || count(*) FILTER (WHERE source = 'query' AND outcome = 'applied') FROM channel_messages"
curl -s "$SIM/calls" | jq -r '"ship API calls: \(.ship | length) (\(.ship | map(.result) | group_by(.) | map("\(.[0]) \(length)") | join(", ")))"'
echo "ship-backs reported: $(psql -qtA "$MO" -c "SELECT count(*) FROM channel_shipbacks WHERE result IS NOT NULL"), for MK-5 (refunded): $(curl -s "$SIM/calls" | jq '[.ship[] | select(.tid == "MK-5")] | length')"
echo "refunds booked at the platform's newest amount (MK-7 lowered from 25.00 to 8.00; its order ships the rest):"
psql -qtA "$MO" -F ' ' -c "SELECT r.refund_no, r.kind, r.amount_cents, r.status, c.last_refund_cents AS platform_cents, o.status AS order_status FROM refunds r JOIN channel_refunds c USING (refund_no) JOIN orders o USING (order_id) ORDER BY 1" | sed 's/^/  /'
echo "refunds and returns by line (ordered / shipped by the warehouse / back, per line):"
for n in 9 10; do
    o=$(psql -qtA "$MO" -c "SELECT order_id FROM channel_orders WHERE external_order_id = 'MK-$n'")
    echo "  MK-$n order $(psql -qtA "$MO" -c "SELECT status FROM orders WHERE order_id = '$o'"), outbound $(ops "$WMS/outbounds?order_id=$o" | jq -r '.outbounds[0].status')"
    shipped=$(ops "$WMS/outbounds?order_id=$o" | jq -c '[.outbounds[0].lines[] | {(.sku_id): [.quantity, .returned_quantity]}] | add')
    psql -qtA "$MO" -F ' ' -c "SELECT sku_id, quantity, returned_quantity FROM order_items WHERE order_id = '$o' ORDER BY line_no" \
        | while read -r sku q back; do echo "    $sku: ordered $q, shipped $(jq -r --arg s "$sku" '.[$s][0] // 0' <<<"$shipped"), back $back (warehouse: $(jq -r --arg s "$sku" '.[$s][1] // 0' <<<"$shipped"))"; done
done
echo "stock (on hand / reserved): lamp $(ops "$STK/stock/mk-lamp" | jq -r '"\(.on_hand) / \(.reserved)"'), shade $(ops "$STK/stock/mk-shade" | jq -r '"\(.on_hand) / \(.reserved)"') (20 each at the start; 7 single-lamp trades shipped, MK-9 one lamp and a shade, MK-10 two lamps and a shade with one lamp back: lamp 20 - 7 - 1 - 2 + 1 = 11, shade 18)"
