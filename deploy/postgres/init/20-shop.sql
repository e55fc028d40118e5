-- The sample application tidemark follows in docker compose: a small shop.
--
-- Run after 10-tidemark-role.sql (same conditions). deploy/workload/workload.sh calls
-- shop.tick() in a loop so `docker compose up` shows data flowing into the shapes that
-- docker-compose.yml declares (TIDEMARK_SHAPES).
\set ON_ERROR_STOP on
\getenv tidemark_user TIDEMARK_DB_USER
\if :{?tidemark_user}
\else
do $$ begin raise exception 'TIDEMARK_DB_USER is not set: it names the tidemark role'
    using hint = 'docker-compose.yml passes it to the postgres service'; end $$;
\endif

create schema shop;

create table shop.customers (
    id bigint generated always as identity primary key,
    name text not null,
    country text not null
);

create table shop.orders (
    id bigint generated always as identity primary key,
    customer_id bigint not null,
    region text not null,
    status text not null,
    total numeric(10, 2) not null,
    note text,
    updated_at timestamptz not null default now()
);
-- shapes filter orders on region and total, which are not part of the key: an update
-- moving a row out of a shape is only recognisable with the old row in the WAL
alter table shop.orders replica identity full;

-- tidemark reads the catalog and snapshots of the shape tables, never writes them
grant usage on schema shop to :"tidemark_user";
grant select on all tables in schema shop to :"tidemark_user";

-- Created here by the owner, because a publication FOR TABLE may only be created by
-- the tables' owner: tidemark runs with create_publication = false and finds it.
-- A shape added later on another table needs `alter publication tidemark add table ...`
-- by the owner first.
create publication tidemark for table shop.customers, shop.orders;

-- One transaction of application traffic: a new customer, a few orders, status
-- changes that move orders in and out of the shapes' predicates, and a delete. The
-- orders table is kept near 50,000 rows so a long-running demo stays small.
create procedure shop.tick(new_orders int default 5)
language plpgsql
as $$
declare
    max_customer bigint;
    max_order bigint;
begin
    insert into shop.customers (name, country)
    values ('customer ' || substr(md5(random()::text), 1, 8),
            (array['DE', 'FR', 'US', 'JP', 'BR'])[1 + floor(random() * 5)::int])
    returning id into max_customer;

    insert into shop.orders (customer_id, region, status, total, note)
    select 1 + floor(random() * max_customer)::bigint,
           (array['eu', 'us', 'apac'])[1 + floor(random() * 3)::int],
           'new',
           round((random() * 1000)::numeric, 2),
           case when random() < 0.2 then repeat('note ', 1 + floor(random() * 50)::int) end
    from generate_series(1, new_orders);

    select max(id) into max_order from shop.orders;

    update shop.orders
    set status = (array['paid', 'shipped', 'cancelled'])[1 + floor(random() * 3)::int],
        region = case when random() < 0.1 then 'eu' else region end,
        updated_at = now()
    where id in (select 1 + floor(random() * max_order)::bigint
                 from generate_series(1, greatest(1, new_orders / 2)));

    delete from shop.orders
    where id = (select 1 + floor(random() * max_order)::bigint) and status = 'cancelled';

    delete from shop.orders
    where id in (select id from shop.orders where id <= max_order - 50000 order by id limit 100);
end
$$;
