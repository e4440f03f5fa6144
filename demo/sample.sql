-- Sample data of fkmat's quick start and demo: 1,000 customers, 20,000
-- orders, and the regions the customers live in.
CREATE TABLE regions (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text, region_id int REFERENCES regions);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text);
CREATE INDEX ON orders (customer_id);
INSERT INTO regions VALUES (1, 'Europe'), (2, 'Americas'), (3, 'Asia');
INSERT INTO customers
	SELECT g, 'customer ' || g, (ARRAY['bronze', 'silver', 'gold'])[1 + g % 3], 1 + g % 3
	FROM generate_series(1, 1000) g;
INSERT INTO orders SELECT g, 1 + g % 1000, (g % 500) * 1.25, 'order ' || g FROM generate_series(1, 20000) g;
ANALYZE regions, customers, orders;
