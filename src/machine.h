/*-------------------------------------------------------------------------
 *
 * machine.h
 *		Compiled state machines (machine.c).
 *
 * A machine is compiled on first use into a per-backend cache, each in its
 * own memory context, and dropped when a relcache invalidation of
 * idem_machines reports a change to the definitions; idem_machine_refresh,
 * called once per statement, accepts other sessions' invalidations, so that
 * a redefinition committed elsewhere applies from the next statement, also
 * in an open transaction.  The pointer idem_machine_get
 * returns stays valid until the next call; a caller that keeps it longer
 * compares idem_machine_generation() and calls again when it changed.
 * Definitions are read with the latest snapshot, like a catalog, and no
 * lock is kept.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MACHINE_H
#define IDEM_MACHINE_H

/* A compiled state machine (machine.c). */
/*
 * The most states a machine may have.  A compiled machine keeps its moves as
 * an nstates x nstates matrix in every backend that uses it (1 MB at this
 * size); business processes have tens of states.
 */
#define IDEM_MAX_MACHINE_STATES 1000

typedef struct IdemMachine
{
	MemoryContext cxt;			/* holds the machine and everything below */
	char		name[NAMEDATALEN];
	int			nstates;
	char	  **states;			/* sorted by strcmp */
	bool	   *initial;		/* per state */
	bool		has_initial;	/* false: a row may start in any state */
	bool	   *moves;			/* [from * nstates + to] */
} IdemMachine;

/* machine.c */
extern IdemMachine *idem_machine_get(Oid fn_oid, const char *name);
extern uint64 idem_machine_generation(void);
extern void idem_machine_refresh(void);
extern int	idem_machine_state_index(const IdemMachine *machine, const char *state);

#endif							/* IDEM_MACHINE_H */
