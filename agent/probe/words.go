package probe

// promptWords are what a prefill prompt is made of: short, common English
// words, each at most 8 bytes, so that each is about one token in the
// tokenizers of common models (and exactly one in heft-sim's). Their count
// is a power of two, so a random index takes a whole number of bits.
var promptWords = [256]string{
	"the", "of", "and", "to", "in", "is", "was", "for", "on", "are", "with", "as", "his", "they", "at", "be",
	"this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all", "were", "we", "when", "your",
	"can", "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other", "about",
	"out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "has", "look",
	"two", "more", "write", "go", "see", "number", "no", "way", "could", "people", "my", "than", "first", "water", "been", "call",
	"who", "oil", "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part", "over", "new",
	"sound", "take", "only", "little", "work", "know", "place", "year", "live", "me", "back", "give", "most", "very", "after", "thing",
	"our", "just", "name", "good", "sentence", "man", "think", "say", "great", "where", "help", "through", "much", "before", "line", "right",
	"too", "mean", "old", "any", "same", "tell", "boy", "follow", "came", "want", "show", "also", "around", "form", "three", "small",
	"set", "put", "end", "does", "another", "well", "large", "must", "big", "even", "such", "because", "turn", "here", "why", "ask",
	"went", "men", "read", "need", "land", "differ", "home", "us", "move", "try", "kind", "hand", "picture", "again", "change", "off",
	"play", "spell", "air", "away", "animal", "house", "point", "page", "letter", "mother", "answer", "found", "study", "still", "learn", "should",
	"world", "high", "every", "near", "add", "food", "between", "own", "below", "country", "plant", "last", "school", "father", "keep", "tree",
	"never", "start", "city", "earth", "eye", "light", "thought", "head", "under", "story", "saw", "left", "few", "while", "along", "might",
	"close", "open", "seem", "together", "next", "white", "children", "begin", "got", "walk", "example", "ease", "paper", "group", "always", "music",
	"those", "both", "mark", "often", "until", "mile", "river", "car", "feet", "care", "second", "book", "carry", "took", "science", "eat",
}
