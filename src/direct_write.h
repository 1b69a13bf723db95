/*-------------------------------------------------------------------------
 *
 * direct_write.h
 *		One row into, or one row of, the extension's own tables without SPI
 *		(direct_write.c).
 *
 * idem_direct_insert is INSERT ... ON CONFLICT (primary key) DO NOTHING and
 * idem_direct_update an UPDATE of the row with that primary key, run the
 * way the logical replication apply worker runs them.  Either refuses
 * (IDEM_DIRECT_REFUSED) wherever it could behave otherwise than the SQL
 * statement; the caller then runs its statement through SPI.  Both take
 * RowExclusiveLock on the table, held to the end of the transaction.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_DIRECT_WRITE_H
#define IDEM_DIRECT_WRITE_H

#include "access/attnum.h"
#include "access/tupdesc.h"

typedef enum IdemDirectResult
{
	IDEM_DIRECT_REFUSED,		/* not for this caller or table: use SPI */
	IDEM_DIRECT_WRITTEN,
	IDEM_DIRECT_NOT_WRITTEN		/* the key exists, no row matched, or a
								 * trigger skipped the row */
} IdemDirectResult;

typedef bool (*IdemFillRow) (TupleDesc desc, Datum *values, bool *nulls, bool *given,
							 void *arg);
extern IdemDirectResult idem_direct_insert(Oid relid, IdemFillRow fill, void *arg,
										   bool seen_absent);
typedef bool (*IdemUpdateRow) (TupleDesc desc, Datum *values, bool *nulls, void *arg);
/* Are the table's columns of the types update reads and writes? */
typedef bool (*IdemCheckRowType) (TupleDesc desc);
extern IdemDirectResult idem_direct_update(Oid relid, Datum key1, Datum key2,
										   const AttrNumber *cols, int ncols,
										   IdemCheckRowType check,
										   IdemUpdateRow update, void *arg);

#endif							/* IDEM_DIRECT_WRITE_H */
