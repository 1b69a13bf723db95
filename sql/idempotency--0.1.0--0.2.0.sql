/* idempotency--0.1.0--0.2.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.2.0'" to load this file. \quit

/*
 * Every SQL change since 0.1.0 goes here, appended in the order it was made.
 * The install script of 0.2.0 is built from 0.1.0's and this one (Makefile),
 * so nothing here may assume a fresh install.
 */
