-- Marketplace buyers have their own user-id namespace: an order of the channel belongs to
-- `marketplace:<buyer_id>`, never to a local customer whose token `sub` happens to equal the
-- platform's buyer id (issue 18). Orders the channel created before get the prefix too.
UPDATE orders o
SET user_id = 'marketplace:' || o.user_id
FROM channel_orders c
WHERE c.order_id = o.order_id
  AND c.channel = 'marketplace'
  AND o.user_id NOT LIKE 'marketplace:%';
