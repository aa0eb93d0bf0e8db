"""English words whose inflected forms a stemmer cannot bring back to their base: irregular verbs
("won", "bought", "taught") and irregular plurals ("children", "wives").

A question asks in the base form ("What did his team win?", "What did she buy?") what a turn
told in the past ("We won a trophy", "I bought a new car"); a suffix stemmer leaves "won" and
"win" apart. Recall's index counts such a word under its base as well as under itself (see
:func:`voice_context.recall.index.index_terms`), so either form finds the other.

The lists are closed: the common irregular verbs of English with their past and past
participle, and the plurals that do not end in a suffix a stemmer strips. Left out are forms
that are as often another word, whose base would be a false match: "ground" (grind), "wound"
(wind), "rose" (rise), "bore" (bear), "bound" (bind), "bit" (bite: "a bit"), "leaves" and "lives"
(leaf, life: "she leaves", "he lives"), "people" (person: "the person he met" is one, "people"
anyone), and the forms of verbs that are stopwords ("went", "thought", "knew").

Pure: no clock, no I/O.
"""

from __future__ import annotations

# each verb as three words: base, past, past participle
_VERBS = """
arise arose arisen         awake awoke awoken         beat beat beaten           become became become
begin began begun          bend bent bent             bleed bled bled            blow blew blown
break broke broken         breed bred bred            bring brought brought      build built built
burn burnt burnt           buy bought bought          catch caught caught        choose chose chosen
cling clung clung          come came come             creep crept crept          deal dealt dealt
dig dug dug                draw drew drawn            dream dreamt dreamt        drink drank drunk
drive drove driven         eat ate eaten              fall fell fallen           feed fed fed
feel felt felt             fight fought fought        find found found           flee fled fled
fly flew flown             forbid forbade forbidden   forget forgot forgotten    forgive forgave forgiven
freeze froze frozen        give gave given            grow grew grown            hang hung hung
hear heard heard           hide hid hidden            hold held held             keep kept kept
kneel knelt knelt          lead led led               lean leant leant           leap leapt leapt
learn learnt learnt        leave left left            lend lent lent             light lit lit
lose lost lost             make made made             meet met met               mistake mistook mistaken
overcome overcame overcome pay paid paid              prove proved proven        ride rode ridden
ring rang rung             rise rose risen            run ran run                say said said
see saw seen               seek sought sought         sell sold sold             send sent sent
sew sewed sewn             shake shook shaken         shine shone shone          shoot shot shot
show showed shown          shrink shrank shrunk       sing sang sung             sink sank sunk
sit sat sat                sleep slept slept          slide slid slid            speak spoke spoken
speed sped sped            spend spent spent          spin spun spun             spit spat spat
spring sprang sprung       stand stood stood          steal stole stolen         stick stuck stuck
sting stung stung          stink stank stunk          strike struck struck       strive strove striven
swear swore sworn          sweep swept swept          swim swam swum             swing swung swung
take took taken            teach taught taught        tear tore torn             tell told told
throw threw thrown         understand understood understood                      undergo underwent undergone
undertake undertook undertaken                        wake woke woken            wear wore worn
weave wove woven           weep wept wept             win won won                withdraw withdrew withdrawn
write wrote written
"""

# each noun as two words: base, plural
_NOUNS = """
child children     foot feet          goose geese        half halves        knife knives
loaf loaves        man men            mouse mice
shelf shelves      thief thieves      tooth teeth        wife wives         wolf wolves
woman women
"""

# forms that are as often another word: their base would be a false match
_AMBIGUOUS = frozenset({"rose"})


def _table() -> dict[str, str]:
    words = _VERBS.split()
    verbs = [words[k : k + 3] for k in range(0, len(words), 3)]
    words = _NOUNS.split()
    nouns = [words[k : k + 2] for k in range(0, len(words), 2)]
    return {
        form: base
        for base, *forms in (*verbs, *nouns)
        for form in forms
        if form != base and form not in _AMBIGUOUS
    }


BASE_FORMS: dict[str, str] = _table()
"""An irregular form, lowercased, -> its base ("won" -> "win", "children" -> "child")."""
