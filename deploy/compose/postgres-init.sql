-- Mounted into postgres:15's /docker-entrypoint-initdb.d by compose.yaml: runs once, on an
-- empty data directory. One database per service; each service applies its own migrations
-- (its tables, the outbox, the inbox) at start-up.
CREATE DATABASE "order";
CREATE DATABASE wms;
CREATE DATABASE stock;
