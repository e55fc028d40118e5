-- The role tidemark connects as: LOGIN and REPLICATION, not a superuser.
--
-- Run once by the postgres image on first start (files in /docker-entrypoint-initdb.d
-- run in name order, as POSTGRES_USER in POSTGRES_DB, through psql), and by
-- tests/integration/test_deploy.py against an embedded server. The role name and its
-- password come from the environment (TIDEMARK_DB_USER, TIDEMARK_DB_PASSWORD), the same
-- variables docker-compose.yml puts into tidemark's DSN, so the two cannot drift apart.
-- An existing role is left alone: this file is safe to run again.
\set ON_ERROR_STOP on
\getenv tidemark_user TIDEMARK_DB_USER
\getenv tidemark_password TIDEMARK_DB_PASSWORD
\if :{?tidemark_user}
\else
do $$ begin raise exception 'TIDEMARK_DB_USER is not set: it names the tidemark role'
    using hint = 'docker-compose.yml passes it to the postgres service'; end $$;
\endif
\if :{?tidemark_password}
\else
do $$ begin raise exception 'TIDEMARK_DB_PASSWORD is not set: it is the tidemark role''s password'
    using hint = 'docker-compose.yml passes it to the postgres service'; end $$;
\endif

select format('create role %I login replication password %L', :'tidemark_user',
              :'tidemark_password')
where not exists (select from pg_roles where rolname = :'tidemark_user')
\gexec

-- pg_monitor: the monitor reads pg_stat_replication and pg_replication_slots in full
grant pg_monitor to :"tidemark_user";
