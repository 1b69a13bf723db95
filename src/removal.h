/*-------------------------------------------------------------------------
 *
 * removal.h
 *		The announcement of idem_claim's reuse of a record to the epoch
 *		triggers (removal.c).
 *
 * Everything else of removal.c is its triggers, which the install script
 * attaches to the records.  The announcement lives in backend memory and
 * points into the claim's; it lets exactly the announced row be deleted
 * once, in the transaction that announced it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_REMOVAL_H
#define IDEM_REMOVAL_H

/*
 * removal.c: idem_claim's reuse of a record is no removal.  begin saves the
 * announcement in force into *saved and end puts it back, so a claim nested
 * in a trigger of the reuse does not disarm the outer one; end must run
 * however the reuse ends (PG_FINALLY).
 */
typedef struct IdemRemovalReuse
{
	text	   *scope;			/* NULL: nothing announced */
	text	   *key;
	int64		token;			/* of the row the reuse deletes */
	LocalTransactionId lxid;
} IdemRemovalReuse;

extern void idem_removal_reuse_begin(IdemRemovalReuse *saved, text *scope, text *key,
									 int64 token);
extern void idem_removal_reuse_end(const IdemRemovalReuse *saved);

#endif							/* IDEM_REMOVAL_H */
